"""Engines: run requests under variants and measure them.

`protocol` defines the contract (`Engine`, its optional `Capability`s, returning
`runinfra_opt.records.RequestRecord`) and imports no heavy library; `prompts` tokenizes requests for every
engine; `hf` is the in-process transformers implementation (`hf.engine.HFEngine`, all capabilities: `hf.profile`
and `hf.cost` hold its profiling and cost-table measurement), imported on demand because it imports torch.
"""
