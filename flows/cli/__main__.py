"""`python -m trainflow.flows.cli`: the `trainflow` command."""

from trainflow.flows.cli.main import entry

entry()
