# Phalanx: `make demo` runs the main job, `make test` the suite, `make lint` ruff + mypy.
# Each target bootstraps .venv: torch first (a pinned build), then the project with its dev extras,
# then torchtitan for the GPU check (bench/titan-requirements.txt, without its own requirements).

TORCH_VERSION ?= 2.13.0
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TORCH_VERSION)
PYTEST_ARGS ?=
# Added to the alone run's arguments only (bench/suite_time.py gives it its own report).
ALONE_ARGS ?=
# pytest-xdist workers; 0 runs the suite in one process. One process keeps about one of
# the two cores busy: two workers ran the suite here in 1,259 s against 1,906 s
# (docs/benchmarks.md). Tests marked `alone` run afterwards, in one process of their own:
# inside the parallel run each waited for the other worker's test to end, with its own
# worker idle (170 s and 112 s in a run at 2370638).
TEST_WORKERS ?= 2

.PHONY: demo test soak gpu-check lint venv clean docs

venv: $(STAMP)

$(STAMP): pyproject.toml bench/titan-requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps -r bench/titan-requirements.txt
	touch $@

demo: $(STAMP)
	$(BIN)/phalanx demo

# Exit 5 is "no test selected" (PYTEST_ARGS naming only one kind); both at 5 is a failure.
test: $(STAMP)
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not alone" $(PYTEST_ARGS); \
	shared=$$?; \
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) $(ALONE_ARGS); alone=$$?; \
	echo "make test: pytest exited $$shared (tests run beside another) and $$alone (tests run alone)"; \
	{ [ $$shared -eq 0 ] || [ $$shared -eq 5 ]; } && { [ $$alone -eq 0 ] || [ $$alone -eq 5 ]; } \
		&& [ $$shared$$alone != 55 ]

# By hand, not in CI: 100 random faults (tests/integration/test_random_faults.py), about
# 25 minutes on two cores (an hour's timeout); the seed is printed with the command that
# replays it.
soak: $(STAMP)
	PHALANX_FAULTS=100 PHALANX_FAULT_STEPS=14000 PHALANX_FAULT_TIMEOUT=3600 \
		$(BIN)/python -m pytest -s -p no:cacheprovider tests/integration/test_random_faults.py

# On a lent GPU: the rows of docs/benchmarks.md's GPU check, appended there; without
# CUDA it says so and checks only what runs on a CPU (bench/gpu_check.py).
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

docs: $(STAMP)
	$(BIN)/python -m daemon.config.reference > docs/configuration.md
