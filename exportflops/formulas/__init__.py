"""The formula table. Importing this package registers every built-in formula."""

from . import (  # noqa: F401  (each module registers its formulas on import)
    attention,
    collectives,
    control_flow,
    conv,
    embedding,
    gradients,
    interpolate,
    linalg,
    matmul,
    norm,
    pointwise,
    pool,
    prims,
    reduce,
    rnn,
    spectral,
    zero,
)
from .registry import (
    FLOPS_PER_MAC, FORMULAS, Cost, FormulaTable, OpCall, TensorMeta, register_formula,
)

__all__ = ["FLOPS_PER_MAC", "FORMULAS", "Cost", "FormulaTable", "OpCall", "TensorMeta",
           "register_formula"]
