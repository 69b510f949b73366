# Two entry points: `make book` (the main job) and `make test`. Both create .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch comes from PyPI's default index: a CUDA build on Linux x86-64, which also runs
# on the CPU. For a CPU-only wheel (much smaller), set
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
NB_TIMEOUT ?= 180
export IPYTHONDIR ?= $(CURDIR)/.ipython

.PHONY: venv book test lint unit notebooks execute check clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[book,test]"
	touch $@

book: venv
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@echo "Open $(CURDIR)/_build/html/index.html in your browser."

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

unit: venv
	$(PY) -m pytest tests

notebooks: venv
	$(PY) -m pytest book --nbval --nbval-current-env \
		--nbval-sanitize-with book/nbval.cfg --nbval-cell-timeout $(NB_TIMEOUT)

test: lint unit notebooks

# Re-execute one notebook in place and store its outputs: make execute NB=book/01_quickstart.ipynb
execute: venv
	cd $(dir $(NB)) && $(CURDIR)/$(VENV)/bin/jupyter nbconvert --to notebook --execute \
		--inplace --ExecutePreprocessor.timeout=$(NB_TIMEOUT) $(notdir $(NB))

check: venv
	$(PY) -m distcourse check

clean:
	rm -rf _build
	-IPYTHONDIR=$(IPYTHONDIR) $(VENV)/bin/ipcluster stop --all 2>/dev/null
