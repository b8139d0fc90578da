"""Every ATen op torch.export's IRs can hold is counted, declared free, or decomposed.

How the ops are enumerated (torch 2.13):
1. The core ATen opset: every overload tagged ``torch.Tag.core``. ``run_decompositions()`` with
   torch.export's default table lowers a program to these (docs.pytorch.org, "IRs",
   torch.compiler_ir).
2. What the default export IR keeps un-decomposed beyond them: the CompositeImplicitAutograd ops
   torch.export preserves, ``torch._export.utils._collect_all_valid_cia_ops_for_aten_namespace()``
   (the set torch/export/decomp_utils.py builds the default decomposition table from):
   functional, non-aliasing aten ops such as ``multiply``, ``concat``, ``type_as``, ``outer``.
Ops of neither set that have their own kernel (linear algebra, sparse, quantized, special
functions) can also reach a graph; those without a formula or decomposition are reported
uncounted at analysis time.

"Decomposed" is checked here statically (torch has a decomposition for the op); tests/
test_decompose.py traces the decompositions of each family and checks their counts by hand.
"""

from __future__ import annotations

import torch
from torch._export.utils import _collect_all_valid_cia_ops_for_aten_namespace

from exportflops.count.decompose import decomposition
from exportflops.formulas import FORMULAS


def _core_ops() -> set:
    aten = torch.ops.aten
    ops = set()
    for name in dir(aten):
        packet = getattr(aten, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            ops |= {getattr(packet, o) for o in packet.overloads()
                    if torch.Tag.core in getattr(packet, o).tags}
    return ops


def _how_counted(op) -> str:
    entry = FORMULAS.lookup(op)
    if entry is not None:
        return "free" if entry.zero_reason is not None else "formula"
    return "decomposed" if decomposition(op) is not None else "none"


def test_the_enumeration_finds_the_ops_it_should():
    """A guard on the enumeration itself: core holds mm and add; the preserved set holds the
    aliases the issue names; neither is empty."""
    core, preserved = _core_ops(), _collect_all_valid_cia_ops_for_aten_namespace()
    aten = torch.ops.aten
    assert {aten.mm.default, aten.add.Tensor, aten.convolution.default} <= core
    assert {aten.multiply.Tensor, aten.concat.default, aten.type_as.default,
            aten.outer.default, aten.tile.default} <= preserved


def test_every_op_of_the_export_irs_is_counted_free_or_decomposed():
    ops = _core_ops() | _collect_all_valid_cia_ops_for_aten_namespace()
    missing = sorted(str(op) for op in ops if _how_counted(op) == "none")
    assert missing == [], f"{len(missing)} ops with no formula, zero declaration or " \
                          f"decomposition: {missing}"


def test_an_op_with_a_formula_is_never_also_declared_free_per_packet():
    """Zero declarations are per overload where another overload computes: scatter's plain
    overloads move data, its reducing ones add."""
    aten = torch.ops.aten
    assert _how_counted(aten.scatter.src) == "free"
    assert _how_counted(aten.scatter.value) == "free"
    assert _how_counted(aten.scatter.reduce) == "formula"
    assert _how_counted(aten.scatter.value_reduce) == "formula"
    assert _how_counted(aten._unsafe_index_put.default) == "formula"


def test_every_prim_is_counted_free_or_declared_value_dependent():
    """torch's decompositions may lower to prims (i0's to prims.bessel_i0): each prim torch
    defines (torch._prims; not inductor's, which torch.compile adds for its own lowering) has a
    formula, a zero declaration, or a declared reason (prims.svd), so none leaves its op
    uncounted."""
    import torch._prims

    prims = torch.ops.prims
    missing = sorted(
        str(getattr(packet, overload))
        for packet in (getattr(prims, name) for name in torch._prims.__all__
                       if isinstance(getattr(prims, name, None), torch._ops.OpOverloadPacket))
        for overload in packet.overloads()
        if FORMULAS.lookup(getattr(packet, overload)) is None
        and FORMULAS.value_dependence(getattr(packet, overload)) is None)
    assert missing == [], f"{len(missing)} prims with neither: {missing}"
