#!/usr/bin/env bash
# GPU check for a lent GPU machine (one H200, torch + transformers, no vLLM, no network).
# Writes one JSON of figures (default bench/gpu/gpu_check.json, or $OUT/gpu_check.json when the
# machine's runner gives an $OUT folder); see bench/gpu/check.py for what each figure means.
#
#   bench/gpu/check.sh                 # the whole check, bounded at 8 minutes
#   bench/gpu/check.sh --dry-run       # tiny shapes on the CPU: what the CPU test runs
#
# It uses the machine's own python (no venv is built or carried): set PYTHON to pick another.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON="${PYTHON:-python3}"
DEST="${OUT:-bench/gpu}/gpu_check.json"

# What the trainer imports besides torch: say what is missing before spending minutes.
ERR="$(mktemp)"
if ! "$PYTHON" -c 'import torch, transformers, httpx' 2>"$ERR"; then
  echo "[gpu-check] cannot import what the trainer needs with $PYTHON:" >&2
  tail -n 3 "$ERR" >&2
  echo "[gpu-check] torch and transformers come with the machine; httpx is imported by" \
       "trainer/weight_sync (the engine client). Install it or set PYTHON." >&2
  exit 2
fi
"$PYTHON" -c 'import torch; print("[gpu-check] torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "device(s)")'
exec timeout --kill-after=20 480 "$PYTHON" bench/gpu/check.py --out "$DEST" "$@"
