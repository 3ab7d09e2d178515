"""Prediction: what each variant would take, from measured cost tables and its simulated passes, without timing it.

- `interpolate`: the piecewise-linear reading every cost table uses between its measured points.
- In-process engine, one request at a time: `costmodel` (forward, prefill and candidate-search tables fitted from
  measured samples: `CostModel`) and `batch1` (a request's TTFT and end-to-end time from its passes, and the
  calibrations of the model's overheads on measured requests).
- Serving engine, under load: `steptable` (a scheduler step's time by batch size and tokens per sequence:
  `StepCostTable`), `serving` (a continuous-batching scheduler served from the table: `predict_run`), `figures`
  (the figures and steps read off measured runs), `calibrate` (per-level corrections fitted on the baseline's
  measured run, `predict_level`) and `overhead` (what a speculating server's steps add, fitted on timed variants).

Engines measure the tables (`runinfra_opt.engine`); each method simulates its own passes
(`runinfra_opt.methods`); `runinfra_opt.optimize` feeds both in. Nothing here imports an engine or `optimize`.
"""
