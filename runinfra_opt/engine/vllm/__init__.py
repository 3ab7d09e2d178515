"""vLLM as a serving engine: its own virtual environment, a server per variant, and an HTTP client.

vLLM pins a `transformers` older than the project's, so it cannot share the project's environment: it is
installed into its own (`environment`), given typed serving arguments (`args`, checked by vLLM's own parser in
`validate`), started as a separate server process on loopback behind a per-run API key (`server`), driven by an
async streaming OpenAI-compatible client (`client`), and its Prometheus counters are read before and after a run
(`metrics`). `ngram` is vLLM's own n-gram proposal rule as a pure function, for simulation. Nothing here imports
vLLM itself: it lives in the other environment.
"""
