"""`trainflow config`: the config's JSON schema, or a config file as trainflow resolves it."""

from __future__ import annotations

import argparse
import json

from trainflow.flows.cli.parser import CONFIG, OVERRIDES, parse_overrides


def add(sub) -> None:
    c = sub.add_parser("config", help="the config's JSON schema, or a config file resolved")
    csub = c.add_subparsers(dest="config_command", required=True)
    csub.add_parser("schema", help="print the JSON schema of the config, with a description for every key")
    csub.add_parser(
        "show",
        help="print the config as trainflow resolves it (defaults, paths, inferred task)",
        parents=[CONFIG, OVERRIDES],
    )


def run(args: argparse.Namespace) -> None:
    if args.config_command == "schema":
        from trainflow.config.schema import config_schema

        print(json.dumps(config_schema(), indent=2))
        return
    import yaml

    from trainflow.config import load_config
    from trainflow.run.redact import redact_config

    config = load_config(args.config, parse_overrides(args.set))
    if config.task_inferred:
        print(f"# {config.task_inferred}")
    print(yaml.safe_dump(redact_config(config.to_dict()), sort_keys=False, allow_unicode=True), end="")
