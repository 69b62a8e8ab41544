#!/bin/bash
cat > /app/settings.ini <<'EOF'
[server]
host = 0.0.0.0
workers = 4

[database]
url = sqlite:///data.db

[logging]
level = INFO
EOF
