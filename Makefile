# draftsmith: two commands on a fresh machine, `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test bench lint venv clean

venv: $(STAMP)

# torch==2.13.0 goes in first on a machine without a GPU: it is the CPU build that lies on disk,
# and a bare torch requirement would otherwise pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[test,hf]'
	$(PY) -m pip install -q --no-deps dflash==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/draftsmith demo

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check draftsmith tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
