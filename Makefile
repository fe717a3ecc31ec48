# Paxloom: `make run` trains the default small experiment on CPU, `make test` runs the tests.
# Both install into .venv on first use, with Python 3.12 or newer and the versions of the
# lock, constraints.txt (the GPU machines' jax, jaxlib and flax).
VENV ?= .venv
PY := $(VENV)/bin/python
# The exact version of every package installed; test-newest uses a copy that leaves jax,
# jaxlib, flax and the planner's CUDA plugin free.
LOCK ?= constraints.txt
PIP := $(PY) -m pip install --quiet --constraint $(LOCK)
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CPU8 := XLA_FLAGS=--xla_force_host_platform_device_count=8
# A new directory each time: a job_log_dir with checkpoints resumes instead of starting over.
RUN_DIR ?= runs/tiny-$(shell date +%Y%m%d-%H%M%S)

# The interpreter .venv is made with: the first of python3.12 (the GPU machines'),
# python3.13 and pyenv's 3.12 or newer that runs; `make PYTHON=...` names another.
ifndef PYTHON
PYTHON := $(shell for p in python3.12 python3.13 \
	$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$p; break; }; done)
endif

.PHONY: install install-test run test test-unit test-all newest-env test-newest test-on-newest lint docs bench clean

install: $(STAMP)
install-test: $(TEST_STAMP)

$(STAMP): $(LOCK) requirements.txt requirements-nodeps.txt requirements-plan.txt
	@test -n "$(PYTHON)" || { echo "make: Paxloom needs Python 3.12 or newer: install python3.12 (or name one with make PYTHON=...)"; exit 2; }
	# A new environment where there is none or where its Python is older than 3.12.
	$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) -r requirements.txt
	$(PIP) --no-deps -r requirements-nodeps.txt
	# XLA:GPU for --mode=plan, in its own directory: on the import path of plans only
	# (paxloom/runner/planning/gpu_target.py).
	$(PIP) --no-deps --upgrade --target $(VENV)/xla-gpu-compiler -r requirements-plan.txt
	$(PY) -c "import layers, praxis.layers, jax; print('praxis ok, jax', jax.__version__)"
	touch $(STAMP)

# The tests also need the real clients they check outputs against (requirements-test.txt),
# and MkDocs, whose strict build of docs/ is a test (requirements-docs.txt).
$(TEST_STAMP): $(STAMP) requirements-test.txt requirements-docs.txt
	$(PIP) -r requirements-test.txt -r requirements-docs.txt
	touch $(TEST_STAMP)

# The default experiment: a small GPT on the sample corpus built from text on this machine.
run: $(STAMP)
	$(CPU8) $(PY) main.py --fdl_config=experiments.Tiny --job_log_dir=$(RUN_DIR)

# Tests run in TEST_WORKERS processes (pytest-xdist): most of their time is XLA compiling on
# one core, so two workers on a 2-core machine take about 0.6x the time of one.
TEST_WORKERS ?= 2

# The quick loop: every test but those marked slow. CI runs test-all, slow ones included.
test: $(TEST_STAMP)
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist worksteal --durations=25 tests

# The tests that run in pytest's own process: no main.py or other program started.
test-unit: $(TEST_STAMP)
	$(PY) -m pytest -m "not slow and not process" -n $(TEST_WORKERS) tests

test-all: $(TEST_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25 tests

# The run on the newest jax: a user's environment with the newest jax, jaxlib and
# flax the registry serves, into which Paxloom installs from the lock less those (and the
# planner's CUDA plugin, taken at that jaxlib's release); the install must keep them. Then
# the unit tests and the default training run. newest-env alone builds that environment
# (.ci/run builds it while the whole suite runs).
NEWEST := .venv-newest
NEWEST_FREE := jax|jaxlib|flax|jax-cuda13-pjrt|jax-cuda13-plugin
newest-env:
	rm -rf $(NEWEST)
	$(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/pip install --quiet --upgrade pip
	$(NEWEST)/bin/pip install --quiet --upgrade jax jaxlib flax
	$(NEWEST)/bin/pip freeze | grep -E '^(jax|jaxlib|flax)==' > $(NEWEST)/users-jax.txt
	grep -v -E '^($(NEWEST_FREE))==' constraints.txt > $(NEWEST)/constraints.txt
	v=$$(grep '^jaxlib==' $(NEWEST)/users-jax.txt | cut -d= -f3) && \
		printf 'jax-cuda13-pjrt==%s\njax-cuda13-plugin==%s\n' $$v $$v >> $(NEWEST)/constraints.txt
	$(MAKE) VENV=$(NEWEST) LOCK=$(NEWEST)/constraints.txt install-test
	@$(NEWEST)/bin/pip freeze | grep -E '^(jax|jaxlib|flax)==' | diff $(NEWEST)/users-jax.txt - \
		|| { echo "make: installing Paxloom changed the newest jax/jaxlib/flax (above): widen setup.cfg's ranges once the suite passes on them"; exit 1; }
	@echo "newest: $$(tr '\n' ' ' < $(NEWEST)/users-jax.txt)"

test-newest: newest-env
	$(MAKE) test-on-newest

# The unit tests and the default training run in the environment newest-env built.
test-on-newest:
	$(MAKE) VENV=$(NEWEST) LOCK=$(NEWEST)/constraints.txt test-unit run

# The documentation site, built into site/ (tests/test_docs.py builds it strictly too).
docs: $(TEST_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(CPU8) $(PY) bench/step_overhead.py

clean:
	rm -rf $(VENV) $(NEWEST) newest-env.log runs site
