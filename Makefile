# jobqueue: `make test` and `make bench` work on a fresh clone with Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DJANGO_VENV  := .venv-django
DJANGO_STAMP := $(DJANGO_VENV)/.installed-stamp

.PHONY: setup test docs bench bench-pressure bench-pinned bench-ab bench-scale bench-quick lab lint db-up db-down clean

## setup: build .venv with jobqueue and every extra (embedded server, lab, API, peer queues; idempotent)
setup: $(STAMP) $(DJANGO_STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "jobqueue needs Python 3.11 or newer (found: $$($(PYTHON) --version))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,embedded,lab,api,peers,docs,otel]'
	touch $(STAMP)

# Django 6 (the Django backend's tests) needs Python 3.12 or newer, which the
# project does not: its tests run the test project (tests/django_project) in
# a venv of its own. Without such a Python they are skipped, saying why.
$(DJANGO_STAMP): pyproject.toml
	@py=""; for p in python3.14 python3.13 python3.12 \
		$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
		if $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
			py=$$p; break; fi; done; \
	if [ -z "$$py" ]; then \
		echo "no Python 3.12+ found: the Django tests will be skipped" > $(DJANGO_VENV).missing; \
		cat $(DJANGO_VENV).missing; exit 0; fi; \
	rm -f $(DJANGO_VENV).missing; \
	test -x $(DJANGO_VENV)/bin/python || $$py -m venv $(DJANGO_VENV); \
	if $(DJANGO_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
			-e . 'django>=6,<7'; then touch $(DJANGO_STAMP); else \
		echo "could not install Django 6 into $(DJANGO_VENV) with $$py: the Django tests will be skipped" \
			| tee $(DJANGO_VENV).missing; fi

## test: every test and notebook against the embedded PostgreSQL 16 (or DATABASE_URL);
## the embedded server is stopped again afterwards if this run started it. The tests
## run in TEST_PROCESSES processes at once (pytest-xdist; tests marked `serial` alone),
## without the nbval plugin, whose import costs seconds per process; then the notebooks,
## TEST_PROCESSES at a time too (a notebook's cells in one process, in order), except
## the lessons in LESSONS_ALONE, run after the others with nothing beside them (what
## they show depends on every transaction of the cluster: the pg_subtrans reads of an
## overflowed subtransaction cache, the vacuum horizon).
TEST_PROCESSES ?= 2
LESSONS_ALONE := notebooks/lessons/05_savepoints.ipynb notebooks/lessons/08_vacuum_horizon.ipynb
NBVAL_LESSONS := --nbval --nbval-sanitize-with notebooks/sanitize.cfg
test: setup
	@up=0; [ -n "$$DATABASE_URL" ] || ! $(BIN)/jobqueue db url >/dev/null 2>&1 || up=1; \
	status=0; \
	$(BIN)/python -m pytest -p no:nbval -n $(TEST_PROCESSES) --dist loadfile || status=$$?; \
	if ls notebooks/lessons/*.ipynb >/dev/null 2>&1; then \
		$(BIN)/python -m pytest $(NBVAL_LESSONS) -n $(TEST_PROCESSES) --dist loadfile \
			notebooks/lessons $(LESSONS_ALONE:%=--ignore=%) || status=$$?; \
		$(BIN)/python -m pytest $(NBVAL_LESSONS) $(LESSONS_ALONE) || status=$$?; fi; \
	if ls notebooks/benchmarks/*.ipynb >/dev/null 2>&1; then \
		JOBQUEUE_LAB_SIZE=smoke $(BIN)/python -m pytest --nbval-lax \
			-n $(TEST_PROCESSES) --dist loadfile notebooks/benchmarks || status=$$?; fi; \
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet || status=$$?; \
	[ -n "$$DATABASE_URL" ] || [ $$up = 1 ] || $(BIN)/jobqueue db down; \
	exit $$status

## docs: the documentation site from docs/ (MkDocs, Material, mkdocstrings) into site/;
## `make test` builds it in strict mode, so a broken link or a stale reference fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## bench: the benchmark notebooks at full size (all but pressure) and the per-job cost
## table (ceiling), then BENCHMARKS.md and its plots, as one stamped run; the terminal shows
## where it is and the time left (`python -m jobqueue.benchmarks.run NOTEBOOK` reruns one:
## a partial rerun)
bench: setup
	$(BIN)/python -m jobqueue.benchmarks.run

## bench-pressure: the pressure notebook with vacuum held back for 10 minutes per system
## (`pressure.LONG_PHASES`; most of an hour), a partial rerun stamped like the others
bench-pressure: setup
	JOBQUEUE_BENCH_PRESSURE_PHASES="$$($(BIN)/python -c 'import json; \
		from jobqueue.benchmarks.pressure import LONG_PHASES; print(json.dumps(LONG_PHASES))')" \
		$(BIN)/python -m jobqueue.benchmarks.run pressure

## bench-pinned: the pinned-horizon check (about 4 minutes, a quiet machine): jobqueue
## alone at 500 jobs/s, one idle transaction holding an xid for 120 s; fails when p50 or
## p99 late in the hold is over 1.5x the baseline's. Run it before a change to the claims
## or the leader's chores lands.
bench-pinned: setup
	$(BIN)/python -m jobqueue.benchmarks.pinned

## bench-ab: the worker before and after a change, in one interleaved run (about 4 minutes,
## a quiet machine): OLD=<rev> against NEW=<rev> or, without NEW, this work tree as it is,
## each in its own checkout and database, its worker as the README starts it; a no-op
## drain, a write_row drain and one job's latency, NEW/OLD per round and its median
bench-ab: setup
	@test -n "$(OLD)" || { echo "usage: make bench-ab OLD=<rev> [NEW=<rev>]" >&2; exit 2; }
	$(BIN)/python -m jobqueue.benchmarks.ab '$(OLD)' $(if $(NEW),'$(NEW)')

## bench-scale: the scale notebook at full size (ten million finished jobs, a million
## waiting of another service's types: operator reads and drains beside them)
bench-scale: setup
	$(BIN)/python -m jobqueue.benchmarks.run scale

## bench-quick: the core numbers in a minute, no Jupyter (drain 100/1,000/10,000 jobs, lone-job latency)
bench-quick: setup
	$(BIN)/python -m jobqueue.benchmarks.quick

## lab: JupyterLab on notebooks/, with the database up
lab: setup
	$(BIN)/jobqueue db up
	$(BIN)/jupyter lab notebooks/

## lint: ruff and mypy
lint: setup
	$(BIN)/ruff check jobqueue tests
	$(BIN)/mypy jobqueue

db-up: setup
	$(BIN)/jobqueue db up

db-down: setup
	$(BIN)/jobqueue db down

## clean: stop the embedded server and remove the environment and its data
clean:
	-test -x $(BIN)/jobqueue && $(BIN)/jobqueue db down
	rm -rf $(VENV) .jobqueue
