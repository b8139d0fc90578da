"""One step of the model run on a fake copy of it, each tensor storage recorded from the op that
makes it to the moment its last reference drops.

The step is the user's own eager code (the forward, the loss, autograd's backward and
``torch.optim``'s step) on fake tensors, so what frees a storage is what frees it in a real
run: Python dropping a function's arguments on return, autograd releasing a node's saved
tensors once the node has run, ``AccumulateGrad`` keeping the first gradient it receives as
``.grad`` without a copy. A liveness walk over a graph's last uses would free a module's input
while its forward still holds it; the profiler, and the allocator, see the eager lifetimes.

A storage is seen where an ATen op returns it (a `TorchDispatchMode` above the fake mode); it
dies when its Python storage object is collected (a weak reference's callback, as torch's
``MemTracker`` in torch/distributed/_tools/mem_tracker.py tracks it). Hooks go on the fake copy
only, removed on exit; the user's model is untouched.
"""

from __future__ import annotations

import bisect
import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .optimizers import MasterWeights
from ..capture.held import copied, tensors_in
from ..capture.module_hooks import call_hooks
from .rng_states import checkpoint_regions, rng_state_bytes
from .workspaces import workspace_bytes
from ..torch_internals import (is_traceable_wrapper_subclass, pytree, require, sequence_nr,
                               TorchDispatchMode)

#: Before the step's first op: parameters, buffers, inputs and optimizer states.
BEFORE = -1


@dataclass
class Storage:
    """One tensor storage of the step."""

    nbytes: int
    kind: str
    """parameters, buffers, inputs, optimizer, activations, gradients or temporaries."""
    start: int
    """The op that made it (its index in `StepRun.ops`), `BEFORE` for what exists already."""
    module: str
    """The module running that op (``""``: the root, the loss or the optimizer); for an
    activation, the module whose op saved it for the backward."""
    end: int | None = None
    """The first op after its last reference dropped; None for alive at the step's end."""


@dataclass(frozen=True)
class Op:
    """One ATen op of the step that returns a tensor, in the order it ran."""

    name: str
    module: str
    phase: str
    """forward (the loss included), backward or optimizer."""
    arguments: tuple[tuple[int, int], ...] = ()
    """Each positional argument's (elements, bytes per element), (0, 0) for a non-tensor: what
    a per-rank analysis reads of an op it stands in for (ring attention sends an attention
    call's key and value)."""


@dataclass
class StepRun:
    """What the step ran and every storage it held."""

    ops: list[Op] = field(default_factory=list)
    storages: list[Storage] = field(default_factory=list)


class _Storages(TorchDispatchMode):
    """Records each op and the storages its outputs bring into being, and when each dies."""

    def __init__(self, run: StepRun, module: Callable[[], str],
                 resized: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.run = run
        self.module = module
        self.phase = "forward"
        self.alive: dict[int, tuple[Storage, weakref.ref]] = {}
        """A live storage's address -> its record and the weak reference that sees it die."""
        self.resized = {tensor.untyped_storage()._cdata: (tensor, None) for tensor in resized}
        """Storages that stay while their bytes come and go (``storage.resize_``, no ATen op:
        FSDP2's unsharded parameters): address -> (a tensor on it, the record of its bytes
        now, None while it holds none)."""

    def hold(self, tensor: torch.Tensor, kind: str, start: int, module: str = "") -> Storage:
        """The record of ``tensor``'s storage, made on first sight (a DTensor's: its local
        shard's)."""
        if is_traceable_wrapper_subclass(tensor):
            return [self.hold(t, kind, start, module) for t in _inner(tensor)][0]
        storage = tensor.untyped_storage()
        if storage._cdata in self.resized:
            return self._resized_record(storage._cdata, kind)
        key = storage._cdata  # the C++ storage's address: one for a tensor and its views
        if key in self.alive:
            return self.alive[key][0]
        record = Storage(storage.nbytes(), kind, start, module)
        self.run.storages.append(record)

        def dead(_, record=record, key=key) -> None:
            record.end = len(self.run.ops)
            self.alive.pop(key, None)

        self.alive[key] = (record, weakref.ref(storage, dead))
        return record

    def _resized_record(self, key: int, kind: str) -> Storage:
        """A resized storage's bytes held now, as a record of their own."""
        tensor, record = self.resized[key]
        if record is None:
            record = Storage(tensor.untyped_storage().nbytes(), kind, len(self.run.ops), "")
            self.run.storages.append(record)
            self.resized[key] = (tensor, record)
        return record

    def follow_resizes(self, index: int, kind: str = "parameters") -> None:
        """Before op ``index``: each resized storage's bytes ended where they changed, and
        begun anew at their new size."""
        for key, (tensor, record) in self.resized.items():
            nbytes = tensor.untyped_storage().nbytes()
            if record is not None and record.nbytes == nbytes:
                continue
            if record is not None:
                record.end = index
            self.resized[key] = (tensor, None)
            if nbytes:
                self._resized_record(key, kind).start = index

    def record_of(self, tensor: torch.Tensor) -> Storage | None:
        if is_traceable_wrapper_subclass(tensor):  # a DTensor autograd saves: its shard's
            tensor = _inner(tensor)[0]
        found = self.alive.get(tensor.untyped_storage()._cdata)
        return found[0] if found else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        if not tensors:  # a query (prim.device, a scalar read) allocates nothing
            return result
        index = len(self.run.ops)
        self.follow_resizes(index)
        module = self.module()
        self.run.ops.append(Op(str(func), module, self.phase, tuple(
            (a.numel(), a.element_size()) if isinstance(a, torch.Tensor) else (0, 0)
            for a in args)))
        for tensor in tensors:
            self.hold(tensor, "temporaries", index, module)
        workspace = workspace_bytes(func, result, args, kwargs or {})
        if workspace:  # held while the kernel runs: live at this op only
            self.run.storages.append(Storage(workspace, "temporaries", index, module,
                                             end=index + 1))
        return result


def _inner(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a tensor subclass wraps (a DTensor: its local shard; its mesh is not one)."""
    inner = (getattr(tensor, name) for name in tensor.__tensor_flatten__()[0])
    return [t for t in inner if isinstance(t, torch.Tensor)]


@contextlib.contextmanager
def _module_paths(model: torch.nn.Module) -> Iterator[Callable[[], str]]:
    """The path of the module running now: while a module's forward runs, from hooks on the
    (fake) modules; otherwise in the backward, the module whose forward op made the autograd
    node running (nodes are numbered as they are made; each forward op's number is recorded
    as it dispatches)."""
    get_sequence_nr = require("get_sequence_nr")
    current_node = require("current_autograd_node")
    stack: list[str] = []
    numbers: list[int] = []
    paths: list[str] = []
    def running() -> str:
        node = current_node()
        if stack or node is None:  # a forward runs (a checkpoint's recomputation too)
            path = stack[-1] if stack else ""
            number = get_sequence_nr()
            if not numbers or number > numbers[-1]:
                numbers.append(number)
                paths.append(path)
            return path
        # The forward op that made node n dispatched when the next number was n + 1.
        at = bisect.bisect_right(numbers, sequence_nr(node))
        return paths[at] if at < len(paths) else ""

    with call_hooks(model.named_modules(), lambda path, _: stack.append(path), stack.pop):
        yield running


@contextlib.contextmanager
def _saved_as_activations(storages: _Storages) -> Iterator[None]:
    """A tensor autograd saves in the forward is an activation of the module saving it
    (unless it is a parameter, buffer or input); the pack hook returns the tensor itself, so
    nothing changes."""
    def pack(tensor: torch.Tensor) -> torch.Tensor:
        record = storages.record_of(tensor)
        if record is not None and record.kind == "temporaries" and storages.phase == "forward":
            record.kind = "activations"
            record.module = storages.module()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def run_step(model: torch.nn.Module, args: tuple, kwargs: dict, *, train: bool,
             optimizer: torch.optim.Optimizer | MasterWeights | None,
             loss: Callable[[object], torch.Tensor],
             resized: Callable[[], list[torch.Tensor]] | None = None,
             replay: Callable[[_Storages | None], None] | None = None,
             forward_context: Callable[[], contextlib.AbstractContextManager]
             = contextlib.nullcontext) -> StepRun:
    """Step 2 of the loop (forward, loss, backward, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``), or one forward under no_grad, on ``model``
    (fake, as ``args``, ``kwargs`` and the optimizer's parameters), under its fake mode.
    ``resized()``, called after step 1 (in forward, after a forward before the one recorded):
    tensors whose storages are resized in place over the
    step (FSDP2's unsharded parameters), followed op by op. ``replay(storages)``: the
    forwards and backwards of the step instead of ``model``'s and ``loss``'s (a pipeline
    rank's microbatches, `exportflops.parallel.pipeline.stage_memory`), called with None in
    step 1; it sets the phase of what it runs. ``forward_context()``: entered around each
    forward and loss (autocast)."""
    # The step before the one recorded runs on its own copy of the objects holding the inputs
    # (their tensors shared): a cache it grows is as given again for the recorded step.
    first_args, first_kwargs = copied((args, kwargs), lambda tensor: tensor)
    if train:  # step 1: the optimizer's states exist after it, and gradients are none again
        if replay is not None:
            replay(None)
        else:
            with forward_context():
                value = loss(model(*first_args, **first_kwargs))
            value.backward()
            del value
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elif resized is not None:  # FSDP2 makes the storages it resizes on its first all-gather
        with torch.no_grad():
            if replay is not None:
                replay(None)
            else:
                model(*first_args, **first_kwargs)
    del first_args, first_kwargs
    run = StepRun()
    with _module_paths(model) as running:
        storages = _Storages(run, running, resized() if resized is not None else [])
        _hold_state(storages, model, args, kwargs, optimizer)
        with storages:
            if train:
                with checkpoint_regions(model, lambda: storages.phase == "forward",
                                        lambda: len(run.ops)) as regions:
                    output = _training_step(storages, model, args, kwargs, optimizer, loss,
                                            replay, forward_context)
                run.storages.extend(_rng_states(run, regions))
            else:
                with torch.no_grad(), forward_context():
                    output = model(*args, **kwargs) if replay is None else replay(storages)
        del output  # only now: the caller of a forward holds its output to the step's end
    return run


def _rng_states(run: StepRun, regions: list[tuple[str, int]]) -> list[Storage]:
    """The generator state each checkpoint region keeps (`rng_states`), from its start to the
    end of its backward: saved for the backward, so an activation of the region's module."""
    nbytes = rng_state_bytes()
    held = []
    for path, start in regions:
        backward = [index for index, op in enumerate(run.ops) if op.phase == "backward"
                    and (op.module == path or op.module.startswith(path + "."))]
        held.append(Storage(nbytes, "activations", start, path,
                            end=(backward[-1] if backward else start) + 1))
    return held


def _training_step(storages: _Storages, model: torch.nn.Module, args: tuple, kwargs: dict,
                   optimizer: torch.optim.Optimizer, loss: Callable[[object], torch.Tensor],
                   replay: Callable[[_Storages], None] | None = None,
                   forward_context: Callable[[], contextlib.AbstractContextManager]
                   = contextlib.nullcontext) -> None:
    value = None
    if replay is not None:
        with _saved_as_activations(storages):
            replay(storages)
    else:
        with _saved_as_activations(storages), forward_context():
            value = loss(model(*args, **kwargs))
        storages.phase = "backward"
        value.backward()
    for parameter in model.parameters():
        if parameter.grad is not None:
            storages.hold(parameter.grad, "gradients", len(storages.run.ops)).kind = "gradients"
    storages.phase = "optimizer"
    del value
    if isinstance(optimizer, MasterWeights):  # its fp32 gradients, made here, are gradients
        for gradient in optimizer.gradients():
            storages.hold(gradient, "gradients", len(storages.run.ops)).kind = "gradients"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _hold_state(storages: _Storages, model: torch.nn.Module, args: tuple, kwargs: dict,
                optimizer: torch.optim.Optimizer | None) -> None:
    for parameter in model.parameters():
        storages.hold(parameter, "parameters", BEFORE)
    for buffer in model.buffers():
        storages.hold(buffer, "buffers", BEFORE)
    for module in model.modules():  # a tensor held as a plain attribute (a mask, a table)
        for value in vars(module).values():
            if isinstance(value, torch.Tensor):
                storages.hold(value, "buffers", BEFORE)
    for tensor in tensors_in((args, kwargs)):  # a filled cache's keys and values too
        storages.hold(tensor, "inputs", BEFORE)
    for state in (optimizer.state.values() if optimizer is not None else ()):
        for tensor in pytree.tree_leaves(state):
            if isinstance(tensor, torch.Tensor):
                storages.hold(tensor, "optimizer", BEFORE)
