"""The scaler's fixtures live in tests/scaler_tools.py, shared with its other test directory."""

from tests.scaler_tools import make_settings, token_file

__all__ = ["make_settings", "token_file"]
