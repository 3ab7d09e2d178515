"""transformers as an in-process engine: one request under one variant through `model.generate`, measured exactly.

`engine` runs and times requests (`HFEngine`, `open_engine`); `profile` measures each drafter's agreement with
the target and its acceptance probabilities; `cost` measures the forward, prefill and candidate-search times
that the cost model (`runinfra_opt.predict.costmodel`) is fitted from. `engine` imports torch: import it on demand.
"""
