"""Engines: run one request under one variant and measure it. `protocol` defines the contract."""
