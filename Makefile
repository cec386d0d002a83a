# Two commands: `make demo` and `make test`. Both create/refresh .venv in the checkout.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.altenv-installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/altenv demo

test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --max-worker-restart=0 --durations=25

lint: setup
	$(VENV)/bin/ruff check altenv envs agents tests

clean:
	rm -rf $(VENV) build *.egg-info
