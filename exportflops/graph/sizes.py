"""The graph's dynamic sizes: the shape env export left in its fake tensors, torch's size
symbols renamed after the user's ``torch.export.Dim`` names, and each size's example value and
bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx

from ..records.symbolic import size_symbol
from ..torch_internals import int_oo


@dataclass(frozen=True)
class SizeSymbol:
    """A dynamic size of the graph, under the user's ``torch.export.Dim`` name."""

    symbol: sympy.Symbol
    example: int | None
    """Its value for the example inputs (None for data-dependent sizes)."""
    min: int | None
    max: int | None


def shape_env(graph: torch.fx.Graph):
    """The shape env of the fake tensors export left in the graph (None without any)."""
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
            return val.fake_mode.shape_env
    return None


def size_names(shape_env) -> dict[sympy.Symbol, sympy.Symbol]:
    """torch's ``s0``, ``s77`` -> the name of the ``Dim`` the user gave that size."""
    debug_names = getattr(shape_env, "source_name_to_debug_name", {})
    renames = {}
    for symbol, sources in getattr(shape_env, "var_to_sources", {}).items():
        names = [debug_names.get(source.name) for source in sources]
        name = next((n for n in names if n), None)
        renames[symbol] = size_symbol(name or str(symbol))
    # Sizes with no source keep torch's name: data-dependent ones (u0, ...: a nonzero's count,
    # a routing), and every size of a program loaded from a .pt2 (saving drops the Dim names).
    # As a size symbol a u0 reads as positive though it can be 0: that changes no count, a
    # polynomial evaluated by substitution, and keeps one symbol per name for the JSON round trip.
    for symbol in getattr(shape_env, "var_to_range", {}):
        if symbol not in renames and isinstance(symbol, sympy.Symbol):
            renames[symbol] = size_symbol(str(symbol))
    return renames


def size_symbols(shape_env, renames: dict) -> list[SizeSymbol]:
    """One `SizeSymbol` per user-named size of ``shape_env`` (``renames``: `size_names`)."""
    # torch >= 2.10 renamed var_to_val (kept as a deprecated alias) to backed_var_to_val.
    examples = getattr(shape_env, "backed_var_to_val", None)
    if examples is None:
        examples = shape_env.var_to_val
    symbols, named = [], set()
    for symbol, renamed in renames.items():
        # Replaced: equal to another size, in no expression. A name already listed: sizes
        # torch kept apart that were named one size (`program_edits.name_input_sizes`).
        if symbol in shape_env.replacements or renamed in named:
            continue
        named.add(renamed)
        bounds = shape_env.var_to_range.get(symbol)
        symbols.append(SizeSymbol(
            renamed,
            int(examples[symbol]) if symbol in examples else None,
            _bound(bounds.lower) if bounds is not None else None,
            _bound(bounds.upper) if bounds is not None else None,
        ))
    return symbols


def _bound(value) -> int | None:
    # torch's int_oo (an unbounded Dim) calls itself finite: compare with it explicitly.
    if value in (int_oo, -int_oo) or not value.is_number or value.is_finite is False:
        return None
    return int(value)
