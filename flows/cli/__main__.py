"""`python -m trainflow.flows.cli`: the `trainflow` command."""

from trainflow.flows.cli.app import entry

entry()
