#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

# -I: the grader's own imports never come from the work dir (its cwd) or a user site
python3 -I - <<'EOF'
import json
reward = 0
try:
    config = json.load(open("/app/config.json"))
    expected = {"name": "demo-service", "port": 9090, "debug": False, "features": ["search", "export"]}
    reward = int(config == expected)
except Exception as exc:
    print("config.json unreadable:", exc)
open("/logs/verifier/reward.txt", "w").write(f"{reward}\n")
EOF
