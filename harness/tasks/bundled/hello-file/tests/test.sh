#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

if [ "$(cat /app/greeting.txt 2>/dev/null)" = "Hello, Harness!" ] && [ "$(tail -c1 /app/greeting.txt | od -An -c | tr -d ' ')" = '\n' ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
