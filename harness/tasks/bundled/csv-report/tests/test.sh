#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

# -I: the grader's own imports never come from the work dir (its cwd) or a user site
python3 -I - <<'EOF'
import json
import os

rows = []
if os.path.exists("/app/report.csv"):
    rows = [line.strip() for line in open("/app/report.csv") if line.strip()]
has_file = float(bool(rows))
has_header = float(bool(rows) and rows[0] == "name,score")
body = rows[1:] if has_header else rows
correct_rows = float(body == ["ada,91", "cy,85", "bob,78"])
rewards = {
    "reward": has_file * has_header * correct_rows,
    "has_file": has_file,
    "has_header": has_header,
    "correct_rows": correct_rows,
}
json.dump(rewards, open("/logs/verifier/reward.json", "w"))
EOF
