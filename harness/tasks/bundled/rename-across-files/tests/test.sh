#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
# check.py runs the agent's main.py in a child process and writes the reward itself
# (-I: nothing of the grader's own is imported from the work dir).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
python3 -I /tests/check.py
