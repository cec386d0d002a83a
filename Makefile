# Two commands: `make demo` and `make test`. Both create/refresh .venv in the checkout.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.altenv-installed

.PHONY: setup demo test lint clean gpu-bundle gpu-check

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

# The CUDA check (docs/tuning.md#cuda): `make gpu-bundle` here (nvcc builds the candidates),
# then, on a GPU machine with PyTorch and the bundle carried over, `make gpu-check`.
GPU_BUNDLE := runs/gpu-check/bundle
gpu-bundle: setup
	$(PY) -m altenv.bench.gpu $(GPU_BUNDLE)

gpu-check:
	$(PYTHON) -m pip install -q --no-index --no-deps --target /tmp/altenv-gpu $(GPU_BUNDLE)/whl/*.whl
	PYTHONPATH=/tmp/altenv-gpu $(PYTHON) altenv/bench/gpu_device.py $(GPU_BUNDLE) $${OUT:-runs/gpu-check}

clean:
	rm -rf $(VENV) build *.egg-info
