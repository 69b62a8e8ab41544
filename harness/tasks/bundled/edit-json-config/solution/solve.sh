#!/bin/bash
python3 - <<'EOF'
import json
path = "/app/config.json"
config = json.load(open(path))
config.update(port=9090, debug=False)
json.dump(config, open(path, "w"), indent=2)
EOF
