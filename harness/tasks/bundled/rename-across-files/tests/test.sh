#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

cd /app
out="$(python3 main.py 2>&1)"
if [ "$out" = "report: alice, bob" ] && ! grep -rq "get_usr" --include='*.py' /app \
   && grep -q "def get_user" /app/app/users.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "main.py printed: $out"
  echo 0 > /logs/verifier/reward.txt
fi
