"""The attack suite of issue 14 (a package, so its test modules may share basenames with tests/unit's,
e.g. test_gateway.py)."""
