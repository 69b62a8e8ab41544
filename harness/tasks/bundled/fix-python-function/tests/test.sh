#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
# test_stats.py runs the agent's median() in child processes and writes the reward itself
# (-I: nothing of the grader's own is imported from the work dir).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
python3 -I /tests/test_stats.py > /logs/verifier/unittest.log 2>&1
