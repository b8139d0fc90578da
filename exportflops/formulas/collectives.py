"""Collectives of a parallelized model (torch's ``_c10d_functional`` ops): no arithmetic here;
their message sizes and bandwidth factors, which `exportflops.count.ranks` lists per rank in
``report.collectives``.

Message sizes and factors are nccl-tests' (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
the size of an all-reduce is its tensor, of an all-gather its gathered output, of a
reduce-scatter its input; the bus bandwidth is the algorithm bandwidth (size / time) times
2(n-1)/n for a ring all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, and 1
for broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .registry import FORMULAS, OpCall, Size

#: The namespaces of torch's functional collectives (the autograd one for the differentiable
#: variants that torch.distributed.tensor uses in some plans), and ``c10d``'s in-place ops,
#: which eager FSDP2 calls.
NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d")


@dataclass(frozen=True)
class Kind:
    """How nccl-tests sizes one collective."""

    name: str
    """The collective as reports name it."""
    sized_by: str
    """``input`` or ``output``: the tensors whose bytes are the message size; or the name of
    the argument holding them (c10d's in-place ops take their output as an argument)."""
    factor: object
    """n -> the bus-bandwidth factor for a group of n ranks."""
    shard: str = ""
    """c10d's in-place gather/scatter: the argument holding one rank's shard, so that the group
    size is the message over the shard."""

    def group_size(self, call: OpCall) -> Size:
        """Ranks in the group of a c10d gather or scatter: whole message / one shard."""
        shard = sum(t.numel for t in _tensors(call.get(self.shard)))
        return sum(t.numel for t in _tensors(call.get(self.sized_by))) // shard


def _ring_all_reduce(n: int) -> Fraction:
    return Fraction(2 * (n - 1), n)  # reduce-scatter then all-gather: 2(n-1) steps of 1/n


def _ring(n: int) -> Fraction:
    return Fraction(n - 1, n)  # n-1 steps, each moving 1/n of the message


#: The op's name (without namespace and overload) -> its kind.
KINDS = {
    "all_reduce": Kind("all_reduce", "input", _ring_all_reduce),
    "all_reduce_coalesced": Kind("all_reduce", "input", _ring_all_reduce),
    "all_gather_into_tensor": Kind("all_gather", "output", _ring),
    "all_gather_into_tensor_coalesced": Kind("all_gather", "output", _ring),
    "all_gather_into_tensor_out": Kind("all_gather", "output", _ring),
    "reduce_scatter_tensor": Kind("reduce_scatter", "input", _ring),
    "reduce_scatter_tensor_coalesced": Kind("reduce_scatter", "input", _ring),
    "reduce_scatter_tensor_out": Kind("reduce_scatter", "input", _ring),
    "all_to_all_single": Kind("all_to_all", "input", _ring),
    "broadcast": Kind("broadcast", "input", lambda n: Fraction(1)),
    # c10d's in-place ops (eager FSDP2): the message is the gathered output argument, the
    # scattered input argument.
    "_allgather_base_": Kind("all_gather", "output_tensor", _ring, shard="input_tensor"),
    "_reduce_scatter_base_": Kind("reduce_scatter", "input_tensor", _ring,
                                  shard="output_tensor"),
}


def message_bytes(kind: Kind, call: OpCall) -> Size:
    """nccl-tests' message size of one call: its inputs' bytes, its outputs', or an
    argument's."""
    if kind.sized_by == "input":
        tensors = call.tensor_inputs()
    elif kind.sized_by == "output":
        tensors = call.outputs
    else:
        tensors = _tensors(call.get(kind.sized_by))
    return sum(t.nbytes for t in tensors)


def _tensors(value) -> list:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if hasattr(v, "nbytes")]


FORMULAS.register_zero(
    [f"{namespace}::{name}" for namespace in NAMESPACES for name in KINDS
     if (namespace == "c10d") == name.startswith("_")],
    "communication: its message is in report.collectives, not in FLOPs or memory traffic",
    moves="nothing",
)
FORMULAS.register_zero(
    ["_c10d_functional::wait_tensor"],
    "waits for a collective to finish: no arithmetic, no data moved",
    moves="nothing",
)
FORMULAS.register_zero(
    # torch 2.15 copies gradients in with chunk_cat_mixed_dtype, which casts each gradient to
    # the buffer's dtype as it copies (a cast is a copy here, as aten._to_copy is).
    ["fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat",
     "fsdp::chunk_cat_mixed_dtype"],
    "FSDP2's copies of parameter shards into the all-gather buffer, of the gathered buffer out "
    "to the parameters, of gradients into the reduce-scatter buffer: no arithmetic",
    moves="copy",
)
FORMULAS.register_zero(
    ["fsdp::record_grad_output_stream"],
    "FSDP2 (torch 2.15) marks a gradient buffer as used by a stream: bookkeeping, no data moved",
    moves="nothing",
)
FORMULAS.register_zero(
    ["profiler::_record_function_enter_new", "profiler::_record_function_exit"],
    "a profiler range's start and end marker (FSDP2 labels its steps): no arithmetic",
    moves="nothing",
)
