# draftsmith: two commands on a fresh machine, `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-oldest bench lint venv clean

# Python caches compiled modules here even where the machine sets PYTHONDONTWRITEBYTECODE (this
# one does): without the cache every process the suite starts (two workers, each rank of a
# process group, each CLI and torchrun subprocess) compiled torch and transformers again, 20 s of
# a 31 s import of draftsmith's CLI and transformers' Llama on the 2-core machine.
PYCACHE := env -u PYTHONDONTWRITEBYTECODE

venv: $(STAMP)

# uv installs what pip does in a fifth of the time: a clean `make venv` took 112 s with pip
# (venv 9, pip upgrade 5, torch 55, the extras 42, dflash 1) and 21 s with uv (venv 5, uv 2,
# torch 5, the extras 8, dflash 0.2), 2-core machine, 2026-12-03, uv's cache empty.
# torch==2.13.0 goes in first on a machine without a GPU: it is the CPU build that lies on disk,
# and a bare torch requirement would otherwise pull a multi-GB CUDA build. pip finds that file
# through PIP_FIND_LINKS; uv reads only its own flags, so it is handed the same directory, and
# where PIP_FIND_LINKS is unset pip installs torch (it also reads its own config files).
UV         := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install -q --python $(PY)
TORCH_FIRST := $(if $(PIP_FIND_LINKS),$(UV_INSTALL) --find-links $(PIP_FIND_LINKS),$(PY) -m pip install -q)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q uv
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(TORCH_FIRST) torch==2.13.0; fi
	$(UV_INSTALL) -e '.[test,hf]'
	$(UV_INSTALL) --no-deps dflash==0.1.0
	$(PY) -c "import torch; print('torch', torch.__version__)"
	touch $(STAMP)

demo: $(STAMP)
	$(PYCACHE) $(VENV)/bin/draftsmith demo

# two workers (the CI machine's two cores; most of the suite is the Triton interpreter, one
# Python thread a test), each taking whole files, so a module's process group starts once
test: $(STAMP)
	$(PYCACHE) $(PY) -m pytest -q -n 2 --dist loadfile --durations=15 $(PYTEST_ARGS)

# The suite on the oldest releases draftsmith supports (the GPU machine's image): torch 2.11,
# Triton 3.6, transformers 5.17, and NumPy below 2.4, which Triton 3.6's interpreter needs. Not
# part of `make test`. PyPI's torch 2.11 for Linux is the CUDA build (about 5 GB with its
# libraries; it runs on a CPU); OLDEST_TORCH may name a CPU wheel instead.
OLD_VENV     := .venv-oldest
OLD_PY       := $(OLD_VENV)/bin/python
OLDEST_TORCH ?= torch==2.11.0
OLDEST_PINS  := triton==3.6.0 transformers==5.17.0 'numpy<2.4'

$(OLD_VENV)/.installed: pyproject.toml
	python3 -m venv $(OLD_VENV)
	$(OLD_PY) -m pip install -q uv
	$(OLD_VENV)/bin/uv pip install -q --python $(OLD_PY) $(OLDEST_TORCH) $(OLDEST_PINS)
	$(OLD_VENV)/bin/uv pip install -q --python $(OLD_PY) -e '.[test,hf]' $(OLDEST_TORCH) $(OLDEST_PINS)
	$(OLD_VENV)/bin/uv pip install -q --python $(OLD_PY) --no-deps dflash==0.1.0
	$(OLD_PY) -c "import numpy, torch, transformers, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
	touch $@

test-oldest: $(OLD_VENV)/.installed
	$(PYCACHE) $(OLD_PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	$(PYCACHE) $(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check draftsmith tests benchmarks

clean:
	rm -rf $(VENV) $(OLD_VENV) build *.egg-info
