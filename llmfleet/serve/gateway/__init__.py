"""The OpenAI-compatible gateway: JWT auth, rate limits, validation, and the Redis queue's producer side.

`create_app(settings)` (app.py) builds the FastAPI app; `python -m llmfleet.serve.gateway`
or `llmfleet gateway serve` runs it under uvicorn. docs/gateway.md has the details.
"""
