"""Pure-PyTorch reference MoE: routing, quantization, the MoE layer and its expert-parallel form.

A plain library: it imports torch and the standard library only, never the test harness.
"""

from reference import quant, routing  # noqa: F401
from reference.moe import moe_reference, moe_terms, prepare_weights  # noqa: F401
from reference.recipes import Recipe  # noqa: F401
from reference.routing import route  # noqa: F401

__all__ = ["quant", "routing", "moe_reference", "moe_terms", "prepare_weights", "Recipe", "route"]
