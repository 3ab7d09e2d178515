"""Speculative-decoding methods: one module per method, a registry, and the `Variant` type they describe.

`runinfra_opt.methods.registry.get(name)` returns a method's `SpecMethod` (see `base.py` for what a method
owns). Nothing outside this package tests a method's name.
"""

from runinfra_opt.methods.registry import get as get_method
from runinfra_opt.methods.registry import names as method_names
from runinfra_opt.methods.registry import register as register_method
from runinfra_opt.methods.variant import BASELINE, Variant, draft_short_name, parse_variant_name

__all__ = [
    "BASELINE",
    "Variant",
    "draft_short_name",
    "get_method",
    "method_names",
    "parse_variant_name",
    "register_method",
]
