# The two commands of the README. Both create the virtual environment on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo` installs hopline and what it runs on, nothing for its tests; `make test` adds those.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast lint bench soak clean compiled

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	@echo "make demo [1/3] creating the virtual environment $(VENV) ($(PY))"
	@$(PY) -m venv $(VENV)
	@echo "make demo [2/3] installing hopline and what it runs on into $(VENV) (no test tools, no compiler)"
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $(DEMO_STAMP)

# The relay's hot path compiled with mypyc (src/hopline/compiled.py), rebuilt when any source
# changes: hopline uses a build only when it was made from exactly the sources it runs.
COMPILED := build/compiled/manifest.json
SOURCES := $(shell find src/hopline -name '*.py' -not -path '*/__pycache__/*')

$(COMPILED): $(STAMP) $(SOURCES) tools/compile_hot_path.py
	$(BIN)/python tools/compile_hot_path.py

compiled: $(COMPILED)

# The relay's compiled hot path is an option (`make compiled`, built by `make test` and `make bench`);
# the demo runs the same code from source.
demo: $(DEMO_STAMP)
	@echo "make demo [3/3] hopline demo: a gate run over a sample pull request on the embedded stack"
	@$(BIN)/hopline demo

test: $(STAMP) $(COMPILED)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

# Every check, and the tests that start no real process (no agent child, daemon, CLI run or browser).
test-fast: $(STAMP) $(COMPILED)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -m "not e2e"

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(COMPILED)
	$(BIN)/python -m bench

# `hopline demo` 20 times in a row: each run's time and exit code; exit 1 unless all 20 exit 0.
soak: $(STAMP) $(COMPILED)
	$(BIN)/python -m bench.soak --runs 20

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/compiled
