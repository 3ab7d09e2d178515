"""vLLM as a serving engine: its own virtual environment, a server per variant, and an HTTP client.

vLLM pins a `transformers` older than the project's, so it cannot share the project's environment: it is
installed into its own (`environment`), started as a separate server process on loopback behind a per-run
API key (`server`), driven by an async streaming OpenAI-compatible client (`client`), and its Prometheus
counters are read before and after a run (`metrics`). Nothing here imports vLLM itself: it lives in the other
environment.
"""
