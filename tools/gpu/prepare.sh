#!/usr/bin/env bash
# Run here (CPU, project venv active): what a GPU machine without network needs to train SmolLM2's draft, in the
# git-ignored .gpu/: the GGUF in two parts (a device command carries at most 64 MiB) and the pure-Python wheels
# it lacks (transformers as pinned here, so the target it converts has this machine's fingerprint; gguf).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/wheels
gguf=$(python -c "from dflash_et.checkpoints.fetch import smollm2_gguf; print(smollm2_gguf())")
split -n 2 -d "$gguf" .gpu/smollm2.gguf.part
pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/wheels \
    "transformers==$(python -c 'import transformers; print(transformers.__version__)')" gguf==0.19.0
sha256sum "$gguf" | cut -d' ' -f1 > .gpu/smollm2.gguf.sha256
ls -l .gpu .gpu/wheels
