"""The `packscope` command's tests (a package, so that they share tests/cli/support.py)."""
