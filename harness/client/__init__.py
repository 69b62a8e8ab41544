"""See harness/__init__.py for what runs where."""
