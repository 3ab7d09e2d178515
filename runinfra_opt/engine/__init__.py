"""Engines: run requests under variants and measure them.

`protocol` defines the contract (`Engine`, its optional `Capability`s, returning
`runinfra_opt.records.RequestRecord`) and imports no heavy library; `prompts` tokenizes requests for every
engine; `hf` is the in-process transformers implementation (`hf.engine.HFEngine`, all capabilities: `hf.profile`
and `hf.cost` hold its profiling and cost-table measurement), imported on demand because it imports torch.

`registry` names the engines: for each, how to open it (one `open_engine(EngineSetup)` for every caller), its
typed options (an `EngineOptions` subclass the engine validates, e.g. `vllm.options.VllmOptions`) and what it
can do before it is opened (serve load levels, run inside a Ray trial).
"""
