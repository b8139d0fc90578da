"""What the fast path's cheap pass (`blocks`) records of each ATen op, and the results it reuses.

`Ops` records every ATen op a call runs, as an event of its arguments' and results' keys
(`call_keys.op_key`). With every tensor on meta, an op seen before is not run again when its
result can depend on nothing but those keys; `Functions` does the same one level up, for a
torch function (``F.linear``, ``F.scaled_dot_product_attention``, ``rms_norm``) whose ATen ops
were seen before: it hands back new tensors and the same events, without running the
decomposition (each of its ops is one more Python dispatch). The events are those a run would
have recorded, so the plan is the same. A function with a shape kernel (`shape_kernels.on_meta`:
``linear``, ``layer_norm``, SDPA, ``gelu``, broadcast arithmetic) is not run even the first
time: the kernel makes torch's output, and its one event, keyed as the function's, stands for
the ops it would have run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .call_keys import leaves, Unique, op_key
from .shape_kernels import on_meta
from ..torch_internals import HigherOrderOperator, pytree, require, TorchDispatchMode


class Ops(TorchDispatchMode):
    """Records each ATen op with what its result depends on, in ``events``. A higher-order op
    (``cond``, ``map``) is run, and makes the calls around it unique: its subgraphs are not
    compared.

    With ``reuse`` (every tensor on meta), a functional op seen before with equal arguments is
    not run again: its result is new empty meta tensors of the recorded shapes and strides.
    A meta kernel's result depends on nothing else (meta tensors hold no values), and a
    functional op's result aliases nothing; this makes the pass over a stack of identical
    blocks cost little more than its first block (many meta kernels are Python references)."""

    supports_higher_order_operators = True

    def __init__(self, events: list[tuple], reuse: bool) -> None:
        super().__init__()
        self.events = events
        self.higher_order = False
        self.reuse = reuse
        self.results: dict[tuple, tuple] = {}
        """(op, args key, kwargs key, default dtype) -> (result maker, the op's event)."""
        self.watched: set[int] | None = None
        """The storages of the arguments of the torch function running (`Functions`)."""
        self.wrote_watched = False
        """Whether an op wrote one of those in place."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            self.higher_order = True
            self.events.append((func, object()))
            return func(*args, **kwargs)
        if self.watched is not None and _written(func):
            self.wrote_watched |= any(not isinstance(t, torch.Tensor) or _storage(t) in self.watched
                                      for t in _written_arguments(func, args, kwargs))
        try:
            key = (func, op_key(args), op_key(kwargs), torch.get_default_dtype())
        except Unique:
            self.events.append((func, object()))  # never equal to another op
            return func(*args, **kwargs)
        reused = self.results.get(key)
        if reused is not None:
            make, event = reused
            self.events.append(event)
            return make()
        out = func(*args, **kwargs)
        try:
            event = (*key[:3], op_key(out))
        except Unique:
            self.events.append((func, object()))
            return out
        self.events.append(event)
        if self.reuse and _functional(func) and _all_meta((*args, *kwargs.values()), out):
            # The event itself, not an equal copy: bodies of repeated blocks then hold the
            # same objects, which `_choose` compares by identity before their contents.
            self.results[key] = (_maker(out), event)
        return out


class Functions(TorchFunctionMode):
    """Reuses a torch function's result as `Ops` reuses an op's, where it depends on nothing
    but its arguments' keys: without grad or autocast (autograd records no backward for a made
    tensor; autocast casts below this), outside functorch's transforms (whose tensors are
    wrapped), on meta tensors only, where the call ran keyed ops alone (no module call, no
    unique op), wrote none of its arguments in place as its ops' schemas declare writes (a meta
    tensor holds its sizes alone, and an op that changes them, ``unsqueeze_``, declares it),
    and returned new meta tensors that share no storage with them and need no gradient. The
    key holds the default dtype and inference mode. What else could make a call run other ops,
    the SDPA backend flags, leaves meta alone (its attention is always the math one). A
    function that returned no tensor (``size``, ``shape``) or a view of an argument (``view``,
    ``transpose``: never reusable) is passed through from then on, unkeyed: keying it is then
    all the time it costs beyond its run (a function that copies at other times, ``reshape``,
    then runs those too, to the same events)."""

    def __init__(self, ops: Ops) -> None:
        super().__init__()
        self.ops, self.events = ops, ops.events
        self.results: dict[tuple, tuple] = {}
        """(function, args key, kwargs key, default dtype, inference mode) -> (result maker,
        the events of the call that ran)."""
        self.passed: set = set()
        """Functions that returned no tensor or a view of an argument."""
        self.autocast = require("any_autocast_enabled")
        self.transformed = require("functorch_transforms_active")
        self.undispatched = require("DisableTorchDispatch")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.passed or torch.is_grad_enabled() or self.autocast() or \
                self.transformed() or not _PLAIN.issuperset(types):
            return func(*args, **kwargs)
        try:
            key = (func, op_key(args), op_key(kwargs), torch.get_default_dtype(),
                   torch.is_inference_mode_enabled())
        except Unique:
            return func(*args, **kwargs)
        reused = self.results.get(key)
        if reused is not None:
            make, events = reused
            self.events.extend(events)
            with self.undispatched():  # new tensors, no ops of the call
                return make()
        inputs = [t for t in (*leaves(args), *leaves(kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.layout != torch.strided for t in inputs):  # no storage to tell apart
            return func(*args, **kwargs)
        made = self._made(func, args, kwargs)
        if made is not None:
            events = ((*key[:3], op_key(made)),)
            self.events.extend(events)
            self.results[key] = (_maker(made), events)
            return made
        start = len(self.events)
        self.ops.watched, self.ops.wrote_watched = {_storage(t) for t in inputs}, False
        try:
            out = func(*args, **kwargs)
        finally:
            watched, self.ops.watched = self.ops.watched, None
        results = leaves(out)
        tensors = [t for t in results if isinstance(t, torch.Tensor)]
        if not tensors or any(_storage(t) in watched for t in tensors):
            self.passed.add(func)
        elif self._reusable(inputs, results, self.events[start:]):
            self.results[key] = (_maker(out), tuple(self.events[start:]))
        return out

    def _made(self, func, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The output of a function that has a shape kernel (`shape_kernels.on_meta`), made
        from its arguments' shapes, or None (it runs). Its one event, the function's with its
        arguments' and output's keys, stands for the ops it would have run: equal keys run
        equal ops (what reusing a result rests on), so the plan is the same."""
        op = _KERNEL_OPS.get(func)
        return None if op is None else on_meta(op, args, kwargs)

    def _reusable(self, inputs: list, results: list, events: list[tuple]) -> bool:
        """Whether a call that returned tensors of storages new to it can be reused."""
        return not self.ops.wrote_watched and all(_keyed(event) for event in events) and \
            _all_meta(inputs, results) and all(
                type(t) is torch.Tensor and not t.requires_grad for t in results)


_ATEN = torch.ops.aten
#: Torch functions whose ATen op has a shape kernel, by the same arguments: a first call's
#: output is made from its inputs' shapes (a GPT-2 block's first SDPA on meta ran its math
#: path, some 4 ms; its first layer norm 2 ms).
_KERNEL_OPS = {
    torch.nn.functional.linear: _ATEN.linear.default,
    torch.nn.functional.layer_norm: _ATEN.layer_norm.default,
    torch.nn.functional.scaled_dot_product_attention: _ATEN.scaled_dot_product_attention.default,
    torch.nn.functional.gelu: _ATEN.gelu.default,
    **{function: op for op, functions in (
        (_ATEN.add.Tensor, (torch.add, torch.Tensor.add, torch.Tensor.__add__)),
        (_ATEN.sub.Tensor, (torch.sub, torch.Tensor.sub, torch.Tensor.__sub__)),
        (_ATEN.mul.Tensor, (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__)),
        (_ATEN.div.Tensor, (torch.div, torch.Tensor.div, torch.Tensor.__truediv__)))
       for function in functions},
}

#: Tensor types whose torch functions are torch's own (a subclass may override them).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def _keyed(event: tuple) -> bool:
    """An op's event with its keys (a module's enter or exit, and an op made unique, are pairs)."""
    return len(event) == 4


def _storage(tensor: torch.Tensor) -> int:
    """The tensor's storage, as torch tells two apart (meta storages have no data pointer)."""
    return tensor.untyped_storage()._cdata


@functools.cache
def _written(func) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument the op writes in place."""
    return tuple((index, argument.name) for index, argument in enumerate(func._schema.arguments)
                 if argument.alias_info is not None and argument.alias_info.is_write)


def _written_arguments(func, args: tuple, kwargs: dict) -> list:
    return [args[index] if index < len(args) else kwargs.get(name)
            for index, name in _written(func)]


@functools.cache
def _functional(func) -> bool:
    """The op writes none of its arguments and its results alias none of them."""
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def _all_meta(inputs: Any, out: Any) -> bool:
    """Every tensor argument is on meta and the result is one or more meta tensors."""
    results = leaves(out)
    return bool(results) and all(isinstance(t, torch.Tensor) and t.is_meta for t in results) \
        and all(t.is_meta for t in leaves(inputs) if isinstance(t, torch.Tensor))


def _maker(out: Any):
    """A function returning new empty meta tensors shaped like the tensors of ``out``."""
    if isinstance(out, torch.Tensor):  # most ops: no pytree
        shape, stride, dtype = out.shape, out.stride(), out.dtype
        return lambda: torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    leaves, spec = pytree.tree_flatten(out)
    layouts = [(t.shape, t.stride(), t.dtype) for t in leaves]
    return lambda: pytree.tree_unflatten(
        [torch.empty_strided(shape, stride, dtype=dtype, device="meta")
         for shape, stride, dtype in layouts], spec)
