#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

if python3 /tests/test_stats.py -v > /logs/verifier/unittest.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
