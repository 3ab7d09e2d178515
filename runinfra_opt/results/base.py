"""What every part of the results file is built from: the model base (unknown fields kept, so that a file
written by a later minor version still loads) and the interval every measured figure carries."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Interval(_Model):
    """A point estimate with a 95% interval (bootstrap over requests x repeats)."""

    value: float
    low: float
    high: float
