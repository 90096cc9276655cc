# The two commands of the README: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# pytest exits 5 when it collected no test: that must fail CI, not pass it.
test: setup
	$(PY) -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) bench/core_bench.py

demo: setup
	$(PY) -m flotilla.demo
