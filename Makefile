# jobqueue: `make test` and `make bench` work on a fresh clone with Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup test bench lab lint db-up db-down clean

## setup: build .venv with jobqueue and every extra (idempotent)
setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "jobqueue needs Python 3.11 or newer (found: $$($(PYTHON) --version))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,lab,api]'
	touch $(STAMP)

## test: every test against the embedded PostgreSQL 16 (or DATABASE_URL)
test: setup
	$(BIN)/python -m pytest

## bench: drain 100, 1,000 and 10,000 no-op jobs with one worker and print the table
bench: setup
	$(BIN)/python -m jobqueue.bench

## lab: JupyterLab on notebooks/, with the database up
lab: setup
	$(BIN)/jobqueue db up
	$(BIN)/jupyter lab notebooks/

## lint: ruff and mypy
lint: setup
	$(BIN)/ruff check jobqueue tests alembic
	$(BIN)/mypy jobqueue

db-up: setup
	$(BIN)/jobqueue db up

db-down: setup
	$(BIN)/jobqueue db down

## clean: stop the embedded server and remove the environment and its data
clean:
	-test -x $(BIN)/jobqueue && $(BIN)/jobqueue db down
	rm -rf $(VENV) .jobqueue
