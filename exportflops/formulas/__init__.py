"""The formula table. Importing this package registers every built-in formula.

Loading is all or nothing: if a formula file fails to import, what the attempt registered is
taken back out of `FORMULAS` and the files it imported are forgotten, so the next attempt fails
the same way instead of on a half-filled table (`DuplicateFormulaError`).
"""

import importlib
import sys

from .registry import (
    FLOPS_PER_MAC, FORMULAS, Cost, FormulaTable, OpCall, TensorMeta, absent_ops, register_formula,
)

#: The formula files, one op family each; each registers its formulas into `FORMULAS` on import.
BUILT_IN = ("attention", "collectives", "control_flow", "conv", "embedding", "gradients",
            "interpolate", "linalg", "losses", "matmul", "norm", "pointwise", "pool", "prims",
            "reduce", "rnn", "spectral", "zero")


def _load_built_in() -> None:
    before = FormulaTable(dict(FORMULAS.entries), dict(FORMULAS.value_dependent),
                          set(FORMULAS.absent))
    try:
        for name in BUILT_IN:
            importlib.import_module(f"{__name__}.{name}")
    except BaseException:
        FORMULAS.entries, FORMULAS.value_dependent = before.entries, before.value_dependent
        FORMULAS.absent = before.absent
        for name in BUILT_IN:
            sys.modules.pop(f"{__name__}.{name}", None)
        raise


_load_built_in()

__all__ = ["FLOPS_PER_MAC", "FORMULAS", "Cost", "FormulaTable", "OpCall", "TensorMeta",
           "absent_ops", "register_formula"]
