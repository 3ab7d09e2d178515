"""Distil a small draft model for a target from the target's own greedy outputs on a workload.

`config` (settings, validated), `split` (the deterministic held-out split), `data` (teacher data: greedy
continuations and top-k soft labels, cached), `train` (the draft's architecture, initialisation and training
loop; the only module here that imports torch at module level), `evaluate` (held-out acceptance and the
draft/target cost ratio), `pipeline` (the whole job behind `runinfra-opt draft distill`).
"""
