#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

ok=1
for f in app.log worker.log; do
  [ -f "/app/archive/$f" ] && [ ! -e "/app/inbox/$f" ] || ok=0
done
[ "$(cat /app/archive/app.log 2>/dev/null)" = "started" ] || ok=0
[ "$(cat /app/archive/worker.log 2>/dev/null)" = "job 1 done" ] || ok=0
for f in notes.txt todo.txt; do
  [ -f "/app/inbox/$f" ] || ok=0
done
echo $ok > /logs/verifier/reward.txt
