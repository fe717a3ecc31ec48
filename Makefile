# Paxloom: `make run` trains the default small experiment on CPU, `make test` runs the tests.
# Both install into .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CPU8 := XLA_FLAGS=--xla_force_host_platform_device_count=8
# A new directory each time: a job_log_dir with checkpoints resumes instead of starting over.
RUN_DIR ?= runs/tiny-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install install-test run test test-unit test-all lint docs bench clean

install: $(STAMP)
install-test: $(TEST_STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt requirements-plan.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	# XLA:GPU for --mode=plan, in its own directory: on the import path of plans only
	# (paxloom/runner/planning/gpu_target.py).
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/xla-gpu-compiler \
		-r requirements-plan.txt
	$(PY) -c "import layers, praxis.layers; print('praxis', 'ok')"
	touch $(STAMP)

# The tests also need the real clients they check outputs against (requirements-test.txt),
# and MkDocs, whose strict build of docs/ is a test (requirements-docs.txt).
$(TEST_STAMP): $(STAMP) requirements-test.txt requirements-docs.txt
	$(PY) -m pip install --quiet -r requirements-test.txt -r requirements-docs.txt
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

# The documentation site, built into site/ (tests/test_docs.py builds it strictly too).
docs: $(TEST_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(CPU8) $(PY) bench/step_overhead.py

clean:
	rm -rf $(VENV) runs site
