#!/usr/bin/env bash
# Run on the GPU machine, in the repository's copy, with .gpu/smollm2.gguf.part00 and .gpu/wheels carried by a first
# command and .gpu/smollm2.gguf.part01 by this one (tools/gpu/prepare.sh makes them): joins and checks the GGUF,
# installs the wheels beside the machine's torch, and trains SmolLM2's draft into $OUT/draft (bf16, the shipped
# form) with its card and the log. MINUTES (default 8.5) bounds the training command, DEVICE (cuda) is where it runs; extra arguments go to it
# (a rehearsal on the CPU: DEVICE=cpu MINUTES=4 ... --set synthetic_prompts=32 ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must name the folder whose files come back}"
start=$(date +%s)
cat .gpu/smollm2.gguf.part00 .gpu/smollm2.gguf.part01 > /tmp/smollm2.gguf
echo "$(cat .gpu/smollm2.gguf.sha256)  /tmp/smollm2.gguf" | sha256sum -c -
pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "setup: $(( $(date +%s) - start )) s"
# progress bars every 20 s, one line each, every line stamped with the time, the log written as it goes
TQDM_MININTERVAL=20 PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 -m dflash_et.cli train-draft /tmp/smollm2.gguf \
    "$OUT/draft" --minutes "${MINUTES:-8.5}" --device "${DEVICE:-cuda}" --dtype bf16 --shard-mb 15 \
    --set synthetic_prompts=12000 --set num_prompts=768 --set max_new_tokens=128 --set generate_batch=512 \
    --set batch=32 --set steps=100000 --set compute_budget=null --set curve_points=4 --set precision=auto "$@" 2>&1 \
    | stdbuf -oL tr '\r' '\n' | while IFS= read -r line; do [ -z "$line" ] || echo "$(date +%T) $line"; done \
    | tee "$OUT/log"
