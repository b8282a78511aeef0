# `make run` and `make test` work on a fresh clone: they create .venv on first use.
# TORCH picks the torch build; torch==2.13.0 is the CPU wheel on CPU-only machines.
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0
ARGS  ?=
# test processes (pytest-xdist): most tests start 2-4 rank processes of their own and much of the suite waits on
# them; on the 2-core CI machine 3 workers ran the suite in 21m55s against 24m19s with 2 (2026-11-27).
# 2026-12-06, fresh clones, 3 workers: 1340.6 s (7b7ed72), 1639.1 s (2e8be02), 1509.3 s (27803c7), the machine's
# speed moving more than the code; its 2 CPUs 97% busy (vmstat, first 150 s), so more workers do not help: 4 had
# not finished after 28.5 min (another test command beside it for its first 3 min).
# --dist loadgroup: tests are handed out one at a time in collection order, the slow ones first, and a module's
# tests that share a module-scoped fixture as one unit (tests/conftest.py): no worker is left with a queue of slow
# tests at the end, and no sweep fixture runs on several workers.  One at a time, slow first, without the groups:
# 30m14s on the 2-core machine, module fixtures recomputed on each worker (2026-12-02)
# --durations=30: CI's log lists the 30 slowest tests (setup, call, teardown), where a cut of CI's time starts
WORKERS ?= 3

.PHONY: run test setup clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,loggers]"
	touch $@

run: setup
	$(PY) -m bench $(ARGS)

test: setup
	$(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30 $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
