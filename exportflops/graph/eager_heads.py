"""Grouped-query attention's key/value heads as an eager run passes them, where the exported graph
of a transformers model repeats them.

transformers' ``sdpa_attention_forward`` (``transformers/integrations/sdpa_attention.py``) calls
``scaled_dot_product_attention`` on the key/value heads as they are, with ``enable_gqa=True``,
when the call has no mask and the key and value head dims are equal and at most 256
(``use_gqa_in_sdpa``); otherwise it repeats them to the query heads first (``repeat_kv``: an
``expand`` of a new dim after the heads, a ``reshape`` into them). Eager skips the mask of a
causal sequence without padding (``masking_utils._ignore_causal_mask_sdpa``), but under export
that function returns False (``is_torchdynamo_exporting()``): the graph builds the mask and so
repeats the heads, where an eager run of the same unpadded batch passes neither.

The repeat is found in the graph, not by the model's name: each of the call's key and value is
traced back through ops that only move or repeat elements (`_REPEAT_STEPS`) to the nearest
tensor of its shape but fewer heads. Only a call inside a transformers module is read so: a
model whose own code repeats the heads (exportflops' built-in Llama) runs that repeat eagerly
too. In transformers 5.24 the integration is the only SDPA call after a head repeat (the models'
own ``repeat_kv`` feeds their matmul ``eager_attention_forward``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from .opcall import OpCall, TensorMeta
from .stacks import Stack

aten = torch.ops.aten

#: ``scaled_dot_product_attention`` and the kernels a graph may call it as (a rank traced on fake
#: cpu tensors calls the cpu flash kernel): query, key and value are their first arguments.
_ATTENTION = frozenset({aten.scaled_dot_product_attention.default,
                        aten._scaled_dot_product_flash_attention_for_cpu.default,
                        aten._scaled_dot_product_flash_attention.default,
                        aten._scaled_dot_product_efficient_attention.default,
                        aten._scaled_dot_product_cudnn_attention.default})
#: Ops that move or repeat elements and compute nothing: the steps of a head repeat. A slice is
#: one when it keeps every element (``x[:, :, None]`` under dynamic shapes slices each dim).
_REPEAT_STEPS = frozenset({aten.unsqueeze.default, aten.expand.default, aten.reshape.default,
                           aten.view.default, aten._unsafe_view.default, aten.clone.default,
                           aten.repeat_interleave.self_int, aten.slice.Tensor})
#: The steps that repeat elements: a head repeat has one of them on its way.
_REPEATS = frozenset({aten.expand.default, aten.repeat_interleave.self_int})
#: ``use_gqa_in_sdpa``: the largest head dim transformers passes to SDPA with ``enable_gqa``
#: (on CUDA, cpu and Ascend NPUs; the kernels' limit).
_GQA_HEAD_DIM = 256
#: What `eager_inputs` found, for the call's record.
NOTE = ("transformers repeats the key/value heads and builds the mask only when traced: an eager "
        "call on a batch without padding passes the key/value heads as they are "
        "(enable_gqa=True) and no mask (eager_inputs); counted as the graph runs")


def eager_inputs(node: torch.fx.Node, stack: Stack, call: OpCall,
                 meta: Callable[[torch.fx.Node], TensorMeta]) -> tuple[TensorMeta, ...]:
    """The (query, key, value) an eager run passes the SDPA call ``node`` (in module ``stack``,
    with the graph's arguments ``call``; ``meta`` reads a node's tensor) where the graph repeats
    transformers' key/value heads (module docstring); empty otherwise."""
    if node.target not in _ATTENTION or not stack:
        return ()
    if not stack[-1].type_name.startswith("transformers.") or call.get("enable_gqa"):
        return ()
    query, key, value = call["query"], call["key"], call["value"]
    head_dim = key.shape[-1]
    if not (isinstance(head_dim, int) and head_dim == value.shape[-1] <= _GQA_HEAD_DIM):
        return ()
    sources = [_unrepeated(node.args[i]) for i in (1, 2)]
    if None in sources or len({_expr(_shape(s)[-3]) for s in sources}) != 1:
        return ()
    return (query, *(meta(s) for s in sources))


def _unrepeated(node: Any) -> torch.fx.Node | None:
    """The tensor ``node`` repeats along its head dim (-3): the nearest one back through
    `_REPEAT_STEPS`, past a repeat, of ``node``'s shape with fewer heads; None if there is none.
    """
    shape = _shape(node)
    repeated, current = False, node
    while _moves_elements(current):
        repeated |= current.target in _REPEATS
        current = current.args[0]
        if repeated and _fewer_heads(_shape(current), shape):
            return current
    return None


def _moves_elements(node: Any) -> bool:
    """``node`` is one of `_REPEAT_STEPS`, a slice only when it keeps its input whole."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target in _REPEAT_STEPS):
        return False
    return node.target != aten.slice.Tensor or _same(_shape(node), _shape(node.args[0]))


def _same(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and [_expr(d) for d in a] == [_expr(d) for d in b]


def _fewer_heads(source: tuple | None, repeated: tuple | None) -> bool:
    """``source`` is ``repeated``'s shape (batch, heads, seq, head_dim) with fewer heads, that
    divide its heads."""
    if source is None or repeated is None or len(source) != len(repeated) or len(source) < 3:
        return False
    head = len(source) - 3
    if any(_expr(a) != _expr(b) for i, (a, b) in enumerate(zip(source, repeated)) if i != head):
        return False
    heads, kv_heads = _expr(repeated[head]), _expr(source[head])
    return (isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads < heads
            and heads % kv_heads == 0)


def _shape(node: Any) -> tuple | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _expr(size: Any) -> Any:
    """A size as a value that compares without guarding: an int, or a symbolic size's
    expression."""
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        return int(expr) if expr.is_number else expr
    return size
