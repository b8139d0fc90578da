"""The backward calls autograd makes for ops whose replay records none of its own, built from
the forward call: flex attention's ``flex_attention_backward`` and the index inside its
``score_mod``; the naming and charging of every backward op (`backward_call`); and why an
op's backward cannot be traced, where it cannot.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..graph.opcall import ACTIVATION, OpCall, TensorMeta
from ..graph.walk import NodeCall, op_name

#: Why an op gets no traced backward.
CONTROL_FLOW_REASON = "the backward of control flow (torch.cond, map, while_loop) is not traced"
SCORE_MOD_LAYOUT_REASON = (
    "flex attention's score_mod takes inputs other than (score, b, h, q_idx, kv_idx, "
    "*score_mod_other_buffers), so which of them need a gradient is not known")


def flat_apply_reason(function: str) -> str:
    return (f"flat_apply calls {function}, a Python function export did not trace into: its "
            f"backward is not in the graph")


def custom_function_reason(function: str) -> str:
    return (f"it runs inside the forward of the custom torch.autograd.Function {function}, "
            f"whose backward is user code that torch.export does not capture; autograd runs "
            f"that backward, not these ops' own")


def flex_backward(call: NodeCall, outputs: set[int]) -> NodeCall:
    """The call autograd makes for a flex attention call: ``FlexAttentionAutogradOp.backward``
    runs ``flex_attention_backward(query, key, value, out, logsumexp, grad_out,
    grad_logsumexp, fw_graph, joint_graph, block_mask, scale, kernel_options,
    score_mod_other_buffers, mask_mod_other_buffers)`` (torch/_higher_order_ops/
    flex_attention.py), returning the query's, key's and value's gradients. Built from the
    forward call: a higher-order op's replay records no ops of its own. The gradients of
    ``out`` and ``logsumexp`` are there when those outputs receive one (``outputs``)."""
    forward = call.call
    query, key, value, _, block_mask, scale, options, score_buffers, mask_buffers = (
        forward[f"arg{i}"] for i in range(9))
    out, logsumexp = forward.outputs[:2]
    arguments = (query, key, value, out, logsumexp, out if 0 in outputs else None,
                 logsumexp if 1 in outputs else None, None, None, block_mask, scale, options,
                 score_buffers, mask_buffers)
    op = torch.ops.higher_order.flex_attention_backward
    opcall = OpCall(op, {**{f"arg{i}": a for i, a in enumerate(arguments)},
                         "skipped_pairs": forward.get("skipped_pairs")},
                    tuple(replace(t, kind=ACTIVATION) for t in (query, key, value)))
    return backward_call(call, 0, opcall)


def gather_backward(call: NodeCall) -> NodeCall:
    """The call autograd makes for ``flat_apply(ModIndex, x, *indices)``, the index inside a
    flex attention ``score_mod`` (``bias[h]``): ``ModIndex.backward`` runs
    ``flex_lib.zeros_and_scatter(x.shape, indices, grad)`` (torch/_dynamo/
    _trace_wrapped_higher_order_op.py), returning x's gradient."""
    tensors = [a for a in call.call.args.values() if isinstance(a, TensorMeta)]
    source, indices = tensors[0], tensors[1:]
    op = torch.ops.flex_lib.zeros_and_scatter.default
    opcall = OpCall(op, {"shape": source.shape, "indices": indices, "vals": call.call.out},
                    (replace(source, kind=ACTIVATION),))
    return backward_call(call, 0, opcall)


def backward_call(forward: NodeCall, index: int, op: OpCall, half: str = "") -> NodeCall:
    """The ``index``-th op of ``forward``'s backward (of its ``half``, when split), charged to
    its module. An op under vmap or in a subgraph run per score was replayed once: its
    backward runs as often."""
    return NodeCall(f"{forward.name}.backward{half}.{index}", op.op, op_name(op.op), op,
                    forward.stack,
                    *((forward.region, forward.repeat) if forward.repeat != 1 else ()))
