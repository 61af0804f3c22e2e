"""What the config's keys mean, made from their one description (`trainflow.config.base.key`): the JSON schema
(`trainflow config schema`), docs/configuration.md's key table (`python -m trainflow.config.schema --write`) and
`trainflow init`'s comments."""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainflow.config.root import Config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- the key table: made by `python -m trainflow.config.schema --write` from trainflow/config/ -->"
END = "<!-- end of the key table -->"


def _section(field: FieldInfo) -> type[BaseModel] | None:
    for t in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def fields(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, FieldInfo, bool]]:
    """Every key of the config, dotted, with its field and whether it is a section (a block of keys). A booster's own
    block (model.params.<family>) is one key here: its keys are model.params' own, listed once there."""
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        section = None if extra.get("x-family-block") else _section(field)
        yield prefix + name, field, section is not None
        if section is not None:
            yield from fields(section, f"{prefix}{name}.")


def _field(key: str) -> FieldInfo | None:
    return next((f for k, f, _ in fields() if k == key), None)


def description(key: str) -> str | None:
    """A dotted key's description, or None for a key the config does not have."""
    field = _field(key)
    return field.description if field is not None else None


def brief(key: str) -> str:
    """The description's first clause (up to its first `;`), without markdown: the comment `trainflow init` writes."""
    text = description(key)
    if text is None:
        raise KeyError(key)
    return text.split("; ")[0].replace("`", "")


def shown_default(field: FieldInfo) -> str:
    """A key's default as docs/configuration.md shows it."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "x-default" in extra:
        return str(extra["x-default"])
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    return f"`{json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value}`"


def default_of(key: str) -> str:
    """A dotted key's default as a person reads it, without markdown (init's comments)."""
    field = _field(key)
    if field is None:
        raise KeyError(key)
    return shown_default(field).replace("`", "")


def key_table() -> str:
    """docs/configuration.md's table of every key: key, default, meaning."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, field, is_section in fields():
        if is_section:
            continue
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{key}` | {shown_default(field)} | {text} |")
    return "\n".join(rows)


def docs_with_table(text: str) -> str:
    """The docs' text with the key table between its markers replaced by key_table()."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"{DOCS}: the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n{key_table()}\n{END}{tail}"


def config_schema() -> dict[str, Any]:
    """Config's JSON schema, every property with its description; `task` optional (inferred from the label)."""
    schema = Config.model_json_schema()
    schema["required"] = [k for k in schema.get("required", []) if k != "task"]
    schema["title"] = "trainflow config"
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainflow.config.schema", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite the key table in {DOCS} (else print it)")
    args = parser.parse_args(argv)
    if not args.write:
        print(key_table())
        return 0
    text = DOCS.read_text()
    new = docs_with_table(text)
    if new != text:
        DOCS.write_text(new)
        print(f"rewrote the key table in {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
