# The two commands of the README.
#   make demo   set up this machine (idempotent) and run the main job on the embedded default
#   make test   set up this machine (idempotent) and run the whole test suite
PYTEST_ARGS ?=
# two workers (pytest-xdist): each test module, or folder of modules sharing a session fixture, is one unit of
# work, heaviest first (tests/conftest.py); PYTEST_WORKERS= runs the suite in one process
PYTEST_WORKERS ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: setup demo test bench

setup:
	scripts/setup

# the demo's native tiers first (a verdict within minutes on a fresh machine), the emulated tiers' setup meanwhile in the
# background (scripts/setup --demo); `make test` sets up everything, strictly
demo:
	scripts/setup --demo
	.venv/bin/tiergate demo

# coverage measures the test process and every child it starts (CLI, `tiergate serve`, workers):
# see [tool.coverage.run] in pyproject.toml; then the per-module floor.
test: setup
	rm -f .coverage .coverage.*
	.venv/bin/coverage run -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)
	.venv/bin/coverage combine -q
	.venv/bin/coverage report --skip-covered --sort=cover
	.venv/bin/python scripts/coverage_floor.py 60

bench: setup
	.venv/bin/python bench/run_all.py
