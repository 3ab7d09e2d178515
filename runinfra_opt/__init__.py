"""runinfra-opt: pick the fastest lossless speculative-decoding setup for your own LLM traffic."""

__version__ = "0.1.0"
