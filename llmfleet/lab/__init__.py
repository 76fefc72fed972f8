"""The lab and its test tools: Docker hosts, stand-in packages, the CPU build of vLLM, tiny models."""
