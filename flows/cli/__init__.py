"""The `trainflow` command, in rooms: parser (the arguments, shared options in parent parsers), commands (what each
does), render (summaries for a person), errors (messages and exit codes), app (the entry point)."""

from trainflow.flows.cli.app import entry, main
from trainflow.flows.cli.parser import build_parser
from trainflow.flows.cli.render import format_summary

__all__ = ["build_parser", "entry", "format_summary", "main"]
