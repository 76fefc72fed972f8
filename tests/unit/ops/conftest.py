"""`llmfleet token` reads gateway settings: the fixtures live in tests/gateway_tools.py,
shared with the gateway's unit tests (tests/unit/serve/gateway)."""

from tests.gateway_tools import make_settings, secret_file, tiny_dir

__all__ = ["make_settings", "secret_file", "tiny_dir"]
