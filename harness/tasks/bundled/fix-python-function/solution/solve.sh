#!/bin/bash
cat > /app/stats.py <<'EOF'
def median(values):
    """Return the median of a non-empty list of numbers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 0:
        return (ordered[middle - 1] + ordered[middle]) / 2
    return ordered[middle]
EOF
