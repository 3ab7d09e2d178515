"""Where `optimize`'s confirmation trials run: in this process (`local`, the default: every variant and the
baseline interleaved A B C D per request, see `phases/confirm.py`) or on a Ray cluster (`ray`: one task per
trial, see `ray_cluster.py`). A trial (`trial.py`) is one variant timed with its own baseline repeats on one
node; the run directory on the driver keeps one file per finished trial (`store.py`)."""
