"""A stand-in `vllm` package for tests (see entrypoints/openai/api_server.py)."""

__version__ = "0.0.0+fake"
