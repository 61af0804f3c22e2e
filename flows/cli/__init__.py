"""The `trainflow` command, in rooms: app (the entry point and the list of commands), commands/ (one module per
command: its arguments, what it does, its summary), flow_command (what the commands that run a flow share), parser
(shared options), render (summary parts several commands share), output (files the user names), errors (messages and
exit codes)."""

from trainflow.flows.cli.app import build_parser, entry, main
from trainflow.flows.cli.render import format_summary

__all__ = ["build_parser", "entry", "format_summary", "main"]
