"""A small model zoo: what --perfguard-changed is tried on (tests/test_changed.py)."""
