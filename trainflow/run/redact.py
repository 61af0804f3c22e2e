"""One redaction for everything trainflow writes (MLflow params and tags, checkpoint config.json, the model card,
the summary, logs): environment variable values and credentials inside URIs become ***.

The config object keeps the real values: Ray's workers still get them (runtime_env, worker env vars, pyarrow
filesystems); only what is written or printed goes through here.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# query keys that carry credentials (pyarrow's s3://...?secret_key=..., presigned URLs' X-Amz-Signature, tokens)
CREDENTIAL_KEY = re.compile(r"key|secret|token|passw|pwd|credential|signature|session|auth|sig", re.I)
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`,)\]}]+")
# config keys whose values are all secrets: the Ray guide passes credentials to workers this way
ENV_KEYS = (("scaling", "env_vars"), ("ray", "runtime_env", "env_vars"))
# config mappings whose credential-like keys (CREDENTIAL_KEY) hold secrets: an Iceberg catalog's properties
PROPERTY_KEYS = (("data", "catalog"),)


def redact_uri(uri: str) -> str:
    """uri without its user-info (user:password@) and with credential-like query values masked."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(CREDENTIAL_KEY.search(k) for k, _ in pairs):
            query = urlencode([(k, MASK if CREDENTIAL_KEY.search(k) else v) for k, v in pairs], safe="*:/@")
    if netloc == parts.netloc and query == parts.query:
        return uri
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_known: set[str] = set()  # secret values met in configs of this process, masked wherever they appear
_known_lock = threading.Lock()


def redact_text(text: str) -> str:
    """text with every URI's credentials and every known secret value masked."""
    if "://" in text:
        text = URI.sub(lambda m: redact_uri(m.group(0)), text)
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings) with redact_text applied to every string."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def _credential_entries(config: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(mapping, key) of every credential-like key of the PROPERTY_KEYS mappings a config dict holds."""
    return [(props, k) for props in _env_sections(config, PROPERTY_KEYS) for k in props if CREDENTIAL_KEY.search(k)]


def _env_sections(config: dict[str, Any], paths: tuple[tuple[str, ...], ...] = ENV_KEYS) -> list[dict[str, Any]]:
    """The env var mappings (ENV_KEYS, or the given paths) a config dict holds."""
    found = []
    for path in paths:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            found.append(node)
    return found


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config (as a dict) fit to be written: env var values masked, URIs without credentials."""
    out = copy.deepcopy(config)
    for env in _env_sections(out):
        for k in env:
            env[k] = MASK
    for props, k in _credential_entries(out):
        props[k] = MASK
    return redact_value(out)


def secrets_of(config: dict[str, Any]) -> set[str]:
    """The secret values a config holds: env var values and URI passwords/credential query values."""
    found: set[str] = {str(v) for env in _env_sections(config) for v in env.values() if v is not None}
    found.update(str(props[k]) for props, k in _credential_entries(config) if props[k] is not None)

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and "://" in v:
            for m in URI.finditer(v):
                parts = urlsplit(m.group(0))
                if "@" in parts.netloc and not (parts.scheme.startswith("postgres") and parts.password is None):
                    # (a PostgreSQL user name alone is no secret: masking it would mask every word it appears in)
                    userinfo = parts.netloc.rsplit("@", 1)[0]
                    found.update(p for p in (userinfo, *userinfo.split(":", 1)) if p)
                found.update(val for k, val in parse_qsl(parts.query) if CREDENTIAL_KEY.search(k) and val)

    walk(config)
    # short values ("1", "true") would mask ordinary text everywhere: only values that can be secrets
    return {s for s in found if len(s) >= 6}


class _RedactingFactory:
    def __init__(self, previous):
        self.previous = previous

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report, not ours
            return record
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return record


def protect(config: dict[str, Any]) -> None:
    """Mask this config's secrets in every log record of the process from now on (and keep masking them in
    redact_text): called where a config enters (CLI, each flow run)."""
    with _known_lock:
        _known.update(secrets_of(config))
        factory = logging.getLogRecordFactory()
        if not isinstance(factory, _RedactingFactory):
            logging.setLogRecordFactory(_RedactingFactory(factory))
