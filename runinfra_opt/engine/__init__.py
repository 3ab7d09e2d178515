"""Engines: run one request under one variant and measure it.

`protocol` defines the contract (`Engine`, returning `runinfra_opt.records.RequestRecord`) and imports no
heavy library; `hf` is the in-process transformers implementation (`HFEngine`), imported on demand because
it imports torch.
"""
