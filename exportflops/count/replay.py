"""Replay one op of an exported graph on fresh fake tensors, with autograd on, and record the
ATen ops that run: which outputs autograd tracks, and the ops of its vector-Jacobian product.

Fake tensors share the graph's shape env, so symbolic sizes stay the user's expressions. A
recorded op's tensor holds what the forward argument it is (a view of) holds: the weight in a
linear's input-gradient ``mm`` is a weight read; gradients, saved activations and the parameters'
gradients it computes are activations.
"""

from __future__ import annotations

import contextlib
from typing import Any

import sympy
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..graph.opcall import ACTIVATION, OpCall
from ..capture.quiet import quiet_fake_tensor_log
from ..records.symbolic import parse_count
from ..torch_internals import (
    enable_python_dispatcher, FakeTensorMode, free_unbacked_symbols, pytree, TorchDispatchMode,
)
from ..graph.walk import example_value, op_call


def fake_replay(shape_env, *, grad: bool, allow_non_fake_inputs: bool,
                python_dispatcher: bool = False) -> contextlib.AbstractContextManager:
    """Fake tensors on the graph's shape env (its sizes stay its symbols), outside inference
    mode whatever the caller is in, with autograd on or off; with ``python_dispatcher``,
    composite ops decompose through their Python implementations, which take symbolic sizes
    where some C++ ones refuse them, as torch.export traces them."""
    stack = contextlib.ExitStack()
    if python_dispatcher:
        stack.enter_context(enable_python_dispatcher())
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad() if grad else torch.no_grad())
    stack.enter_context(FakeTensorMode(shape_env=shape_env,
                                       allow_non_fake_inputs=allow_non_fake_inputs))
    stack.enter_context(quiet_fake_tensor_log())  # a failed replay is its node's record
    return stack


class Tracer:
    """Replays ops under a fake mode sharing the graph's shape env; caches by op and layout."""

    def __init__(self, shape_env, renames: dict, kinds: dict | None = None,
                 measured: dict | None = None) -> None:
        self.shape_env = shape_env
        self.renames = renames
        self.kinds = {} if kinds is None else kinds
        """Graph node -> what it holds (`walk.GraphRead.kinds`; activations absent)."""
        self.measured = measured or {}
        """torch's symbol -> its value on the example, for the sizes read from values that a
        run of the program measured (`capture.Captured.given_sizes`)."""
        self.cache: dict[tuple, Any] = {}

    def outputs_needing(self, node: torch.fx.Node, grad_positions: set[int],
                        autocast: tuple | None) -> frozenset[int]:
        """Indices of the op's outputs autograd tracks when the inputs at ``grad_positions``
        need a gradient."""
        key = ("forward", *self._key(node, grad_positions, autocast))
        if key not in self.cache:
            with self._mode():
                _, results, _ = self._forward(node, grad_positions, autocast)
                self.cache[key] = frozenset(i for i, r in enumerate(results)
                                            if isinstance(r, torch.Tensor) and r.requires_grad)
        return self.cache[key]

    def backward_of(self, node: torch.fx.Node, grad_positions: set[int], outputs: set[int],
                    autocast: tuple | None) -> list[OpCall]:
        """The ops autograd dispatches for the gradient flowing into ``outputs``."""
        key = ("backward", *self._key(node, grad_positions, autocast), tuple(sorted(outputs)))
        if key not in self.cache:
            self.cache[key] = self._first_working_replay(node, grad_positions, outputs, autocast)
        return self.cache[key]

    def _first_working_replay(self, node: torch.fx.Node, grad_positions: set[int],
                              outputs: set[int], autocast: tuple | None) -> list[OpCall]:
        """The replay as the op runs; where a C++ kernel refuses symbolic sizes (aten.pad's
        amounts read from values), through the Python dispatcher; where that fails too, at
        the example's measured sizes (the counts are then at them too). The first refusal is
        the one reported."""
        tries = [({}, False), ({}, True)] + ([(self.measured, False)] if self.measured else [])
        refusal = None
        for measured, python_dispatcher in tries:
            try:
                return self._replay(node, grad_positions, outputs, autocast, measured,
                                    python_dispatcher)
            except Exception as error:  # any op may refuse a fake replay; the next try may not
                refusal = refusal or error
        raise refusal

    def _key(self, node: torch.fx.Node, grad_positions: set[int], autocast: tuple | None):
        flat = pytree.tree_leaves((node.args, node.kwargs))
        # The outputs' layouts too: two ops on equal inputs differ there when their sizes are
        # read from values (each masked_select's count is its own symbol).
        return (node.target, tuple(_layout(a, i in grad_positions) for i, a in enumerate(flat)),
                tuple(_layout(v, False) for v in _outputs(example_value(node))),
                repr(autocast), self._flat_kinds(flat))

    def _flat_kinds(self, flat: list) -> tuple[str, ...]:
        return tuple(self.kinds.get(a, ACTIVATION) if isinstance(a, torch.fx.Node)
                     else ACTIVATION for a in flat)

    def _mode(self, python_dispatcher: bool = False) -> contextlib.AbstractContextManager:
        # Autograd on whatever mode the caller is in: the backward is what train mode asks for.
        return fake_replay(self.shape_env, grad=True, allow_non_fake_inputs=False,
                           python_dispatcher=python_dispatcher)

    def _replay(self, node: torch.fx.Node, grad_positions: set[int], outputs: set[int],
                autocast: tuple | None, measured: dict,
                python_dispatcher: bool) -> list[OpCall]:
        with self._mode(python_dispatcher):
            leaves, results, values = self._forward(node, grad_positions, autocast, measured)
            kinds = {_storage(v): kind for v, kind in zip(values, self._flat_kinds(
                pytree.tree_leaves((node.args, node.kwargs))))
                if isinstance(v, torch.Tensor) and kind != ACTIVATION}
            tensors = [results[i] for i in sorted(outputs) if i < len(results)
                       and isinstance(results[i], torch.Tensor) and results[i].requires_grad]
            if not tensors or not leaves:
                return []
            grads = [torch.ones_like(t) for t in tensors]
            recorder = Recorder({**self.renames, **self._as_in_graph(results, node)}, kinds)
            with recorder:  # outside autocast, as loss.backward() runs
                torch.autograd.grad(tensors, leaves, grads, allow_unused=True)
        return recorder.calls

    def _as_in_graph(self, results: list, node: torch.fx.Node) -> dict:
        """The sizes the replay read from values afresh (a masked_select's count: a new
        symbol each run), each renamed to the size the graph's node has there."""
        renames = {}
        for fresh, kept in zip(results, _outputs(example_value(node))):
            if isinstance(fresh, torch.Tensor) and isinstance(kept, torch.Tensor):
                renames |= {new.node.expr: _expr(old).xreplace(self.renames)
                            for new, old in zip(fresh.shape, kept.shape)
                            if isinstance(new, torch.SymInt)
                            and isinstance(new.node.expr, sympy.Symbol)
                            and free_unbacked_symbols(new) - free_unbacked_symbols(old)}
        return renames

    @staticmethod
    def _forward(node: torch.fx.Node, grad_positions: set[int], autocast: tuple | None,
                 measured: dict | None = None) -> tuple[list, list, list]:
        """The op on fresh fake tensors of its inputs' layouts, under the autocast region it ran
        in (whose casts autograd records, and whose dtypes the backward then runs in), its
        scalar sizes of the symbols in ``measured`` at their values: the leaves, the results,
        and the flat arguments it ran on."""
        op = node.target
        flat, spec = pytree.tree_flatten((node.args, node.kwargs))
        device = _device(flat, op)
        values = [_at(_fresh(a, device), measured) for a in flat]
        leaves = [values[i].requires_grad_() for i in sorted(grad_positions)]
        if op._schema.is_mutable:  # an in-place op on a leaf is refused by autograd
            values = [v.clone() if i in grad_positions else v for i, v in enumerate(values)]
        args, kwargs = pytree.tree_unflatten(values, spec)
        with _autocast(autocast):
            result = op(*args, **kwargs)
        return leaves, list(result) if isinstance(result, (list, tuple)) else [result], values


def _outputs(val: Any) -> list:
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _storage(tensor: torch.Tensor) -> StorageWeakRef:
    """Equal for a tensor and its views (fake tensors too): what a view reads is its base's."""
    return StorageWeakRef(tensor.untyped_storage())


def _autocast(arguments: tuple | None) -> contextlib.AbstractContextManager:
    if arguments is None:
        return contextlib.nullcontext()
    device_type, dtype, enabled, cache_enabled = arguments
    return torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


#: Composite ops that choose their kernel by the device: for meta tensors SDPA chooses its
#: math fallback (``_fused_sdp_choice`` on meta), whose backward is plain ``bmm``s with the causal
#: mask a tensor, where cpu chooses the fused kernel whose backward carries ``is_causal``. A model
#: built on meta is counted as on cpu, so these are replayed on cpu fake tensors.
_KERNEL_BY_DEVICE = frozenset({torch.ops.aten.scaled_dot_product_attention.default})


def _device(flat: list, op: Any = None) -> torch.device | None:
    """meta for an op on meta weights and cpu tensors (indices a model built on meta makes
    with ``torch.arange`` on cpu: LongT5's relative positions), which its backward would
    refuse to mix; cpu for an op of `_KERNEL_BY_DEVICE` on meta; None otherwise (each tensor
    where it is)."""
    meta = torch.device("meta")
    devices = {v.device for v in map(_value, flat) if isinstance(v, torch.Tensor)}
    if meta in devices and op in _KERNEL_BY_DEVICE:
        return torch.device("cpu")
    return meta if len(devices) > 1 and meta in devices else None


def _at(value: Any, measured: dict | None) -> Any:
    """A scalar size whose symbols all have values in ``measured``: that value."""
    if not measured or not isinstance(value, torch.SymInt):
        return value
    fixed = parse_count(value.node.expr.xreplace(measured))
    return fixed if isinstance(fixed, int) else value


def _value(value: Any) -> Any:
    return example_value(value) if isinstance(value, torch.fx.Node) else value


def _fresh(value: Any, device: torch.device | None = None) -> Any:
    value = _value(value)
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   device=device or value.device)
    return value


def _layout(value: Any, needs_grad: bool) -> Any:
    value = _value(value)
    if isinstance(value, torch.Tensor):
        return (str(tuple(value.shape)), str(value.stride()), value.dtype, str(value.device),
                needs_grad)
    return repr(value)


#: Metadata queries the autograd engine makes of every gradient: no tensor, no work.
_ENGINE_QUERIES = {torch.ops.prim.device.default}


class Recorder(TorchDispatchMode):
    """Records each ATen op autograd dispatches, as the `OpCall` a formula reads; a tensor
    sharing storage with one of ``kinds`` (a forward argument or a view of it) holds its kind."""

    def __init__(self, renames: dict, kinds: dict | None = None) -> None:
        super().__init__()
        self.renames = renames
        self.kinds = {} if kinds is None else kinds
        self.calls: list[OpCall] = []

    def kind_of(self, tensor: torch.Tensor) -> str:
        return self.kinds.get(_storage(tensor), ACTIVATION) if self.kinds else ACTIVATION

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func not in _ENGINE_QUERIES:
            self.calls.append(op_call(func, args, kwargs, result, self.renames,
                                      kind_of=self.kind_of))
        return result

