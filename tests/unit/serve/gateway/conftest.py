"""The gateway's unit tests: the fixtures live in tests/gateway_tools.py, shared with
`llmfleet token`'s tests (tests/unit/ops)."""

from tests.gateway_tools import make_settings, secret_file, tiny_dir

__all__ = ["make_settings", "secret_file", "tiny_dir"]
