"""The worker: drains the Redis queue into vLLM engines (see app.py and docs/gateway.md)."""
