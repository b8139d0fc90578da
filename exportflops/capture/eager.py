"""The eager fallback: one call of a model that ``torch.export`` refuses but that runs, recorded
at the dispatch level, as ``FlopCounterMode`` counts it.

A model may run eagerly and still be refused by export: LeViT's attention stores on itself a
tensor its ``forward`` computes, which export rejects as a lifted fake constant. The model is
then run once as given (on meta when its tensors are, else on its real tensors: the values
decide its branches as they do in any run) under a ``TorchDispatchMode`` that records every
ATen op, as the fast path's cheap pass does (`blocks._Ops`), each with the module calls
around it from forward hooks held only for the run. Each op becomes a `NodeCall` like an
exported node's, so the same formula table counts it (`count.apply.count_node`).

What the records are: the ops eager dispatches below autograd, so composites are already
decomposed (``aten.addmm`` and ``aten.t`` where export keeps ``aten.linear``; ``aten.mm`` or
``aten.bmm`` for ``matmul``), in-place ops stay in place, and sizes are the example's (no
symbolic sizes); branches are those the run took.

In train mode the forward runs with autograd on and ``torch.autograd.grad`` then runs its
backward, from every floating output that needs a gradient (seeded with ones, as
``loss.backward()`` of their sum) to the parameters and inputs that require one (nothing is
accumulated into ``.grad``). A backward op is charged to the forward op whose autograd node runs
it, and to that op's modules: autograd numbers its nodes as it creates them
(``_get_sequence_nr``), and each node's pre-hook, on this run's graph only, says which node runs.

Work the dispatcher never sees (values handed to numpy, Python's arithmetic on an ``.item()``, a
tensor made from them again) is recorded as a call too, named (``Tensor.numpy``), with why its
work is missing (`capture.outside`): the count then lists it as uncounted, never as covered.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..graph.opcall import ACTIVATION, STATE, WEIGHT
from ..graph.stacks import ModuleFrame, Stack
from ..graph.walk import NodeCall, op_call, op_name, storage_id
from ..records.names import qualified_name
from ..torch_internals import (TorchDispatchMode, get_sequence_nr, pytree,
                               sequence_nr)
from .export import run_kept
from .held import copied
from .outside import LIFT_FRESH, UNSEEN_WRITE, HostCalls, Unfilled


@dataclass(frozen=True)
class EagerCall:
    """One ATen op of the eager run, as the counting sees it."""

    node: NodeCall
    phase: str = "forward"
    """``backward`` for an op autograd ran to compute gradients (train mode)."""
    differentiates: str = ""
    """For a backward op: the name of the forward op whose autograd node ran it."""
    outside: str = ""
    """For a call whose work torch does not see (`capture.outside`): why; its node is named
    after the call (``Tensor.numpy``), counted as no op."""


def eager_calls(model: torch.nn.Module, args: tuple, kwargs: dict, *,
                train: bool) -> list[EagerCall]:
    """Every ATen op of one call ``model(*args, **kwargs)``, forward then (``train``) backward,
    with its module stack. The model's buffers and the random generators are as before after
    it (`run_kept`), the objects holding the inputs too (a cache it grows), and no hook is left
    on any module or autograd node; what the model's own ``forward`` does to itself (an
    attribute it sets) or writes into an input tensor in place is its own. Raises what the run
    raises."""
    paths = {id(module): path for path, module in model.named_modules()}
    recorder = _Recorder(model)
    # The run's own copy of the objects holding the inputs' tensors, the tensors shared: a
    # filled DynamicCache the step grows (each layer's keys reassigned) stays the user's length.
    args, kwargs = copied((args, kwargs), lambda tensor: tensor)
    with run_kept(model, args, kwargs), _module_calls(model, paths, recorder), \
            torch.enable_grad() if train else torch.no_grad():
        with recorder.recording():
            output = model(*args, **kwargs)
        recorder.returned(output)
        if train:
            _backward(model, args, kwargs, output, recorder)
    return recorder.calls


class _Recorder(TorchDispatchMode):
    """Records each ATen op as a `NodeCall` under the module calls running it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.calls: list[EagerCall] = []
        self.stack: list[ModuleFrame] = []
        self.names: Counter = Counter()
        self.spans: list[tuple[int, int, Stack]] = []
        """(first, end, stack): the autograd sequence numbers a module call created."""
        self.made_by: dict[int, str] = {}
        """Autograd sequence number -> the forward op whose dispatch created that node."""
        self.created = get_sequence_nr()
        """The sequence number autograd gives its next node, at the last op recorded."""
        self.running: tuple[Stack, str] | None = None
        """In the backward: the stack and forward op of the autograd node running."""
        tensors = [*model.parameters(), *model.buffers()]
        self.weights = {storage_id(t) for t in tensors} - {None}
        """Storages of the parameters and buffers: what they and their views hold."""
        self.state: set[int] = set()
        """Storages of buffers an op of the run writes (a running mean): state, not weights."""
        self.host = HostCalls(self._left_torch, self._where)
        self.unfilled = Unfilled()

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Both halves on: the ops dispatched, and the Python calls that hand values out."""
        with self.host, self:
            yield

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = getattr(func, "_schema", None)
        named = {} if schema is None else dict(
            zip((a.name for a in schema.arguments), args)) | kwargs
        self._written(schema, named)
        name = self._name(getattr(func, "_opname", None) or op_name(func))
        if self.running is None:
            created = get_sequence_nr()
            self.made_by.update(dict.fromkeys(range(self.created, created), name))
            self.created = created
        stack, phase, differentiates = self._frame()
        unwritten = self.unfilled.seen(func, named, out, f"node {name!r} in {self._where()}")
        if unwritten is not None:
            self._left_torch(UNSEEN_WRITE, *unwritten)
        maker, outside = self.host.made_from_host() if func is LIFT_FRESH else ("", "")
        call = op_call(func, args, kwargs, out, {}, kind_of=self._kind)
        node = NodeCall(name, func, maker if outside else op_name(func), call, stack)
        self.calls.append(EagerCall(node, phase, differentiates, outside))
        return out

    def _frame(self) -> tuple[Stack, str, str]:
        """The module stack, phase and forward op of what runs now."""
        if self.running is None:
            return tuple(self.stack), "forward", ""
        (stack, differentiates) = self.running
        return stack, "backward", differentiates

    def _where(self) -> str:
        stack = self._frame()[0]
        return f"module {stack[-1].path!r}" if stack and stack[-1].path else "the root module"

    def _left_torch(self, name: str, tensor: torch.Tensor, why: str) -> None:
        """The call ``name`` (``Tensor.numpy``) handed ``tensor``'s values out of torch, or
        (`UNSEEN_WRITE`) code outside torch wrote them."""
        stack, phase, differentiates = self._frame()
        call = op_call(name, (tensor,), {}, None, {}, kind_of=self._kind)
        base = name.rpartition(".")[2].replace(" ", "_")
        node = NodeCall(self._name(base), name, name, call, stack)
        self.calls.append(EagerCall(node, phase, differentiates, why))

    def _name(self, base: str) -> str:
        """``addmm``, ``addmm_1``, ...: as export names its nodes."""
        seen = self.names[base]
        self.names[base] += 1
        return base if seen == 0 else f"{base}_{seen}"

    def _written(self, schema, named: dict) -> None:
        """A parameter or buffer the op writes in place (``(a!)`` in its schema) holds state;
        ``named``: the op's arguments by schema name."""
        if schema is None:
            return
        written = [argument.name for argument in schema.arguments
                   if argument.alias_info is not None and argument.alias_info.is_write]
        for value in pytree.tree_leaves([named.get(name) for name in written]):
            storage = storage_id(value)
            if storage in self.weights:
                self.state.add(storage)

    def returned(self, output) -> None:
        """The model returned ``output``: a tensor of it no op wrote was written outside."""
        for tensor in _tensors(output, set()):
            if storage_id(tensor) in self.unfilled.allocations:
                self._left_torch(UNSEEN_WRITE, tensor, self.unfilled.unwritten(
                    storage_id(tensor), "returned by the model"))

    def _kind(self, tensor: torch.Tensor) -> str:
        storage = storage_id(tensor)
        if storage in self.state:
            return STATE
        return WEIGHT if storage in self.weights else ACTIVATION


@contextlib.contextmanager
def _module_calls(model: torch.nn.Module, paths: dict[int, str],
                  recorder: _Recorder) -> Iterator[None]:
    """The recorder's stack follows the module calls (hooks removed on exit, also on error):
    a module's pre-hook runs first and its forward hook last, so the stack covers its hooks;
    each call's frame key is ``path`` for its first call, ``path@1`` for its second, as
    export's keys count calls. Each call's span of autograd sequence numbers is kept."""
    calls: Counter = Counter()
    starts: list[int] = []

    def enter(path: str, module: torch.nn.Module):
        def hook(*_):
            key = path if calls[path] == 0 else f"{path}@{calls[path]}"
            calls[path] += 1
            recorder.stack.append(ModuleFrame(path, qualified_name(type(module)), key))
            starts.append(get_sequence_nr())
        return hook

    def leave(*_):
        recorder.spans.append((starts.pop(), get_sequence_nr(), tuple(recorder.stack)))
        recorder.stack.pop()

    handles = []
    try:
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(enter(paths[id(module)], module),
                                                            prepend=True))
            handles.append(module.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _backward(model: torch.nn.Module, args: tuple, kwargs: dict, output,
              recorder: _Recorder) -> None:
    """The backward of the eager run, recorded (see the module's docstring). Gradients flow
    from every floating tensor the model returns that needs one."""
    outputs = [t for t in _tensors(output, set())
               if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    wanted = [t for t in (*model.parameters(), *pytree.tree_leaves((args, kwargs)))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outputs or not wanted:
        return
    seeds = [torch.ones_like(t) for t in outputs]  # made outside the recorder: no op of the model
    handles = [node.register_prehook(functools.partial(_running, recorder, node))
               for node in _graph_nodes(outputs)]
    try:
        with recorder.recording():
            torch.autograd.grad(outputs, wanted, seeds, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()


def _tensors(value, seen: set[int]) -> Iterator[torch.Tensor]:
    """The tensors a model returned: pytree's leaves, and inside an object pytree cannot
    flatten (the very output export may have refused: a result class, a cache), its
    attributes'."""
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif hasattr(leaf, "__dict__") and not isinstance(leaf, (type, torch.nn.Module)) \
                and id(leaf) not in seen:
            seen.add(id(leaf))
            yield from _tensors(list(vars(leaf).values()), seen)


def _running(recorder: _Recorder, node, grads):
    """An autograd node's pre-hook: the backward ops that follow are this node's."""
    number = sequence_nr(node)
    inside = [(first, stack) for first, end, stack in recorder.spans if first <= number < end]
    stack = max(inside, key=lambda span: span[0])[1] if inside else ()
    recorder.running = (stack, recorder.made_by.get(number, ""))


def _graph_nodes(outputs: list[torch.Tensor]) -> list:
    """Every autograd node reachable from ``outputs``' gradient functions."""
    seen, pending, nodes = set(), [t.grad_fn for t in outputs if t.grad_fn is not None], []
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        pending.extend(fn for fn, _ in node.next_functions if fn is not None)
    return nodes
