# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

export HF_HUB_OFFLINE := 1

.PHONY: run test test-unit test-integration bench clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m devstack

test: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-integration: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -m integration $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench.batcher_bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
