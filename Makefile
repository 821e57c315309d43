# ZeRO Kit entry points. Two commands matter (README, Quickstart):
#   make tutorial   set up, then run every notebook headless; executed copies in build/tutorial/
#   make test       set up, then run every test: pytest of helpers and configs, nbval of notebooks
PYTHON ?= python3
VENV ?= .venv
# A CPU build of torch where one is at hand; any torch in requirements.txt's range works.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup tutorial test nbcheck nbclear nbsync clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -r requirements.txt -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

tutorial: setup
	$(BIN)/python tools/run_tutorial.py

test: setup
	$(BIN)/python -m pytest

nbcheck: setup
	$(BIN)/python tools/nbtool.py check

nbclear:
	$(BIN)/python tools/nbtool.py clear

nbsync:
	$(BIN)/python tools/nbtool.py sync

clean:
	rm -rf build .pytest_cache
