# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the project into it when pyproject.toml or constraints.txt
# changed, at the versions pinned in constraints.txt (see `make lock`).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint lock bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf demo.db demo.db-wal demo.db-shm demo-data
	$(BIN)/slotless run examples/settlements.py --db sqlite:///demo.db --slots 8

# The habits, then the suite: any broken one fails the target (and CI, which runs it).
# Two pytest-xdist workers, a whole file each at a time (--dist loadfile keeps a module's
# shared server in one process): most of the suite's wall time is processes starting and
# waiting on each other, so a second worker nearly halves it on two cores. Each test owns
# its temporary directory, free ports and PostgreSQL schema, so the two never share state.
# The 25 slowest are listed at the end: where the 15-minute budget goes, in every CI log.
test: lint
	./scripts/test-servers.sh
	$(BIN)/pytest -n 2 --dist loadfile --durations=25

# The static checks alone: lint, formatting, the import layers (pyproject.toml's
# [tool.importlinter]), types (its [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# Re-pin constraints.txt to what .venv holds: first installs whatever pyproject.toml asks
# for that .venv lacks (unconstrained: pins already installed stay), then writes the exact
# version of every package the dev extra pulls in, transitively. To move a pin on purpose:
# `.venv/bin/pip install -U NAME`, then `make lock`; commit constraints.txt.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python scripts/lock.py > constraints.txt.new
	mv constraints.txt.new constraints.txt
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/python -m benchmarks.throughput && $(BIN)/python -m benchmarks.fanout
	$(BIN)/python -m benchmarks.slots && $(BIN)/python -m benchmarks.capacity
	$(BIN)/python -m benchmarks.dedup

clean:
	rm -rf $(VENV) *.db *.db-wal *.db-shm .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
