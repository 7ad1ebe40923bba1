# Two targets a user needs: `make repro` (set up, then run the pipeline) and `make test`.
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: setup repro test
setup: $(VENV)/.installed

# dflash (z-lab's reference, a test oracle only) hard-pins versions that clash with ours: no deps.
# It also installs a `dflash` console script, so it goes first and ours replaces it.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --no-deps dflash==0.1.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

repro: setup
	dvc repro

test: setup
	pytest
