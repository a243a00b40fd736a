# The two commands of the README.
#   make demo   set up this machine (idempotent) and run the main job on the embedded default
#   make test   set up this machine (idempotent) and run the whole test suite
PYTEST_ARGS ?=

.PHONY: setup demo test bench

setup:
	scripts/setup

demo: setup
	.venv/bin/tiergate demo

test: setup
	.venv/bin/pytest --cov=tiergate --cov-report=term:skip-covered $(PYTEST_ARGS)
	.venv/bin/python scripts/coverage_floor.py 60

bench: setup
	.venv/bin/python bench/run_all.py
