# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Both create the virtual environment first; nothing has to be installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.turbotrain-installed
TEST_WORKERS ?= 2

.PHONY: demo test lint test-gpu gpu-check bench overhead clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of the tested torch first: an unpinned torch would pull GBs of CUDA wheels.
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[all,test,lint]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/turbotrain demo

test: $(STAMP)
	# System packages the tests use (nginx, iproute2, chromium, ...); installs only what is missing.
	bash scripts/ci-deps.sh
	# The package's bytecode, once: where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it) nothing writes it,
	# and each of the suite's hundreds of Python processes (doctor ranks, --verify runs, launchers) would compile
	# turbotrain's sources again at start-up, about 0.25 s of CPU each. Python still reads bytecode that is there.
	$(PY) -m compileall -q -j 0 src
	# The tests that time real runs alone on one process; those whose runs need one core two at a time, each on a
	# core of its own (no more of them than cores); then the rest on $(TEST_WORKERS) (tests/conftest.py says which
	# are which). Every part always runs, and any failing fails the target. The rest reads no time: there torch keeps
	# to one intra-op thread (OMP_NUM_THREADS=1, inherited by the processes its tests start), since two workers with a
	# thread per core each spin against each other on two cores, a fifth of that part's time (docs/benchmarks.md).
	$(PY) -m pytest -m 'exclusive and not one_core and not gpu and not slow'; alone=$$?; \
	TURBOTRAIN_TEST_ONE_CORE=1 $(PY) -m pytest -m 'one_core and not gpu and not slow' --dist loadgroup \
		-n $$(( $$(nproc) < $(TEST_WORKERS) ? $$(nproc) : $(TEST_WORKERS) )); one_core=$$?; \
	OMP_NUM_THREADS=1 $(PY) -m pytest -m 'not exclusive and not gpu and not slow' -n $(TEST_WORKERS) --dist loadgroup; \
		shared=$$?; \
	exit $$(( alone || one_core || shared ))

# Lint and types (pyproject.toml [tool.ruff], [tool.mypy]); .ci/run runs it before the tests. A # noqa or
# # type: ignore says why on its own line: a bare one (only codes after it) fails here.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src
	$(VENV)/bin/mypy
	@! grep -rnE --include='*.py' '#[[:space:]]*(noqa(:[[:space:]]*[A-Z]+[0-9]+([[:space:]]*,[[:space:]]*[A-Z]+[0-9]+)*)?|type:[[:space:]]*ignore(\[[^]]*\])?)[[:space:]]*$$' src tests \
		|| { echo "make lint: the suppressions above do not say why (add ' - why' or '  # why' on the line)"; exit 1; }

# The full ablation (GPU scale on CUDA): paste runs/bench.md into docs/benchmarks.md.
bench: $(STAMP)
	$(VENV)/bin/turbotrain bench --json runs/bench.json --markdown runs/bench.md --plot runs/bench.png

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu

# Every GPU check in one command for one call of the device tool (issue 16; docs/bench.md "The GPU run"):
# the machine's own torch with CUDA, no venv, no network; pytest -m gpu, the GPT-2 and ResNet-50 bench,
# nvidia-smi and turbotrain env, all under $OUT (default runs/gpu-check).
gpu-check:
	bash scripts/gpu_check.sh

overhead: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
