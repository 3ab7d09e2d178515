"""The serving-engine predictor in a run (`optimize.predictor.Serving`, for engines with `STEP_COSTS` and `SERVE_LOAD`):
the glue between the run's state and `runinfra_opt.predict`. Its costs are `serving.costs`, its predictions at batch
1 and at every load level `serving.levels`, its capacity predictions `serving.capacity`.

A serving engine pays a server launch per variant, so `optimize` predicts every variant from the baseline's server alone
and launches only the best few. `measure` (phase `cost`) measures the step-cost table on the baseline's server;
`predict` (phases `predict` and `repredict`) simulates every variant's passes from the baseline's greedy output and
serves them through the scheduler model, at batch 1 and at every `--load` level, calibrated on the baseline's measured
runs after confirmation, and for capacity at the rates a capacity search offers. A draft model's variants are predicted
too once `profile` (phase `profile`) has its teacher-forced agreement with the baseline server's outputs, computed
in-process, and its own step-cost table, measured on a server of the draft alone; variants of other drafters (heads) are
timed instead, with a note. The decision uses measured figures only.
"""

from runinfra_opt.optimize.serving.costs import draft_cost as draft_cost
from runinfra_opt.optimize.serving.costs import measure as measure
from runinfra_opt.optimize.serving.costs import most_prefill_tokens as most_prefill_tokens
from runinfra_opt.optimize.serving.costs import profile as profile
from runinfra_opt.optimize.serving.costs import profiled as profiled
from runinfra_opt.optimize.serving.costs import step_table as step_table
from runinfra_opt.optimize.serving.levels import pace as pace
from runinfra_opt.optimize.serving.levels import predict as predict
from runinfra_opt.optimize.serving.levels import predict_capacity as predict_capacity
