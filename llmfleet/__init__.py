"""llmfleet: serve fine-tuned LLMs with vLLM on bare-metal GPU hosts."""

__version__ = "0.1.0"
