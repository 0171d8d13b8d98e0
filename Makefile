# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the project into it when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf demo.db demo.db-wal demo.db-shm demo-data
	$(BIN)/slotless run examples/settlements.py --db sqlite:///demo.db --slots 8

test: $(STAMP)
	./scripts/test-servers.sh
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python -m benchmarks.throughput && $(BIN)/python -m benchmarks.fanout
	$(BIN)/python -m benchmarks.slots && $(BIN)/python -m benchmarks.capacity
	$(BIN)/python -m benchmarks.dedup

clean:
	rm -rf $(VENV) *.db *.db-wal *.db-shm .pytest_cache .ruff_cache
