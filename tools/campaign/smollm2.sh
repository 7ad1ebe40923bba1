#!/usr/bin/env bash
# One session of SmolLM2's draft campaign on this machine's CPU (docs/measurements.md#a-draft-from-two-cpu-cores):
# continues campaigns/smollm2/state (or starts it), writes its best draft (bf16, 15 MB) and card to drafts/smollm2 at
# the end and the state every save_minutes; the time-stamped log goes to campaigns/smollm2/logs/. MINUTES (default
# 90) bounds the session; extra arguments go to `dflash train-draft` (--set synthetic_prompts=N: more replies).
# Run it in the background (nohup) from the repository's root with the venv active, time nothing else meanwhile,
# let it end before the session does, and commit campaigns/smollm2 and drafts/smollm2: a clone without the state's
# weights (state.safetensors, 93 MB, not in git) goes on from that draft.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p campaigns/smollm2/logs
log="campaigns/smollm2/logs/$(date -u +%Y-%m-%dT%H%M).log"
TQDM_MININTERVAL=60 PYTHONUNBUFFERED=1 dflash train-draft smollm2 drafts/smollm2 \
    --resume campaigns/smollm2/state --minutes "${MINUTES:-90}" --device cpu --dtype bf16 \
    --set steps=20000 --set compute_budget=null --set batch=16 --set anchors=16 --set block_size=16 \
    --set num_prompts=889 --set synthetic_prompts=1500 --set max_new_tokens=128 --set generate_batch=96 \
    --set head_vocab=8192 --set warm_start=true --set save_minutes=20 --set precision=auto "$@" 2>&1 \
    | stdbuf -oL tr '\r' '\n' | while IFS= read -r line; do [ -z "$line" ] || echo "$(date -u +%T) $line"; done \
    | tee "$log"
