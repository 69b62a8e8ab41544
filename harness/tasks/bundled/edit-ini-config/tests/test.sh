#!/bin/bash
# Runs after the agent, from the task workdir; python3 and coreutils only (no installs).
mkdir -p /logs/verifier

# -I: the grader's own imports never come from the work dir (its cwd) or a user site
python3 -I - <<'EOF'
import configparser
reward = 0
try:
    cfg = configparser.ConfigParser()
    assert cfg.read("/app/settings.ini")
    ok = (
        cfg.get("server", "workers") == "4"
        and cfg.get("server", "host") == "0.0.0.0"
        and cfg.get("database", "url") == "sqlite:///data.db"
        and cfg.get("logging", "level") == "INFO"
    )
    reward = int(ok)
except Exception as exc:
    print("settings.ini check failed:", exc)
open("/logs/verifier/reward.txt", "w").write(f"{reward}\n")
EOF
