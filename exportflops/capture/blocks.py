"""The fast path's plan: which module calls are copies of an earlier one, found by one cheap pass.

Deep models are stacks of identical blocks, and ``torch.export`` traces every one of them. The
cheap pass runs the model once eagerly on meta (or fake) tensors, as ``FlopCounterMode`` does,
with hooks around every module call and a dispatch mode that records every ATen op (`cheap_ops`,
which on meta also reuses results seen before). A module call is a
*repeat* of an earlier call (its *model*) when all of these are equal:

1. the module trees: class of every submodule at every relative path, training flags, and the
   shape, dtype, device and ``requires_grad`` of every parameter and buffer;
2. the inputs: pytree structure, and per tensor shape, stride, dtype, device and
   ``requires_grad``; other leaves by value (ints, floats, strings, ``None``, dtypes); grad
   mode, inference mode and autocast state;
3. the outputs, likewise;
4. what the call ran: every ATen op with its arguments' shapes, dtypes and scalar values, and
   every submodule call, in order (the proof that the code and the attributes the code reads
   behave the same).

And when nothing makes sharing unsafe: both modules run exactly once, their submodules only
inside them, no parameter, buffer or submodule of theirs is reachable from outside, no
module of theirs has hooks or an instance ``forward``, and no input or output leaf is an
object (a cache) that the call could change. Blocks inside wrapped regions (``no_grad``,
autocast, checkpointing, custom autograd Functions, control flow) are found after export and
traced in full. Anything else is traced in full too.

The pass runs the model's ``forward`` Python, which the export then runs again: a model in
which no two modules are alike (`_alike_modules`) has nothing to repeat, and is not passed over
at all. What a ``forward`` assigns to its modules in the pass is put back after it.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..records.names import ancestors, qualified_name
from .call_keys import Unique, flat_key, flattened_call, flattened_output, leaf_key
from .cheap_ops import Functions, Ops
from .cheap_run import attributes_kept, cheap_mode
from .export import buffers_kept
from .quiet import quiet_fake_tensor_log
from ..torch_internals import pytree, require

@dataclass(frozen=True)
class TensorSlot:
    """A tensor output of a repeated call, as its stub must make it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


@dataclass(frozen=True)
class Repeat:
    """One module call replaced by the nodes of its model's call."""

    path: str
    model: str
    """Path of the module whose call it repeats."""
    outputs: Any
    """Its output as a pytree whose tensor leaves are `TensorSlot`s."""
    grad_inputs: bool
    """Whether a tensor input requires grad (the stub ties its outputs to those)."""


@dataclass
class Plan:
    repeats: dict[str, Repeat] = field(default_factory=dict)
    """Path of each repeated module -> its repeat."""


def plan_blocks(model: torch.nn.Module, args: tuple, kwargs: dict) -> Plan:
    """The repeats of one call ``model(*args, **kwargs)``; an empty plan when the cheap pass
    fails or finds none (the full export then runs and reports any error itself)."""
    if not _alike_modules(model):
        # No call can repeat another: the cheap pass would find nothing, and skipping it runs
        # the forward's Python once (in the export), as an eager count does.
        return Plan()
    owners = _owners(model)
    trace = _traced(model, args, kwargs, _unique_paths(model, owners))
    if trace is None:
        return Plan()
    return _choose(model, owners, trace)


def _traced(model: torch.nn.Module, args: tuple, kwargs: dict,
            paths: dict[int, str | None]) -> _Trace | None:
    """The cheap pass: one eager call on meta or fake tensors, its module calls and ops in
    order; None when it fails or runs a higher-order op (whose branches are not compared)."""
    try:
        # The model may change its inputs' Python objects (a cache appends its entries): the
        # export that follows must see them as the user gave them.
        args, kwargs = copy.deepcopy((args, kwargs))
    except Exception:  # an input that cannot be copied: trace in full
        return None
    trace = _Trace(paths)
    cheap = cheap_mode(model, args, kwargs)
    ops = Ops(trace.events, reuse=isinstance(cheap, contextlib.nullcontext))
    functions = Functions(ops) if ops.reuse else contextlib.nullcontext()
    failed = True
    try:
        # Under fake tensors a real buffer written in place (a running count) is still written:
        # it is put back, from a copy taken before the fake mode.
        # Attributes kept from before the hooks: the hooks' own entries are then no copy.
        with buffers_kept(model), quiet_fake_tensor_log(), cheap, \
                attributes_kept(model.modules()), trace.hooks(model), \
                torch.random.fork_rng(devices=[]), ops, functions:
            model(*args, **kwargs)
        failed = False
    except Exception:  # the full export reports the model's own errors with their hints
        return None
    finally:
        if ops.higher_order or failed:
            # An eager torch.cond (while_loop, map) compiles its branches with dynamo, and
            # compiled under this dispatch mode they break the export that follows (torch
            # 2.13: "Attempted to inline function marked as skipped"); dropping dynamo's
            # caches restores it. Such a model is traced in full, as is one the pass fails on
            # (while_loop fails inside dynamo, before this mode sees it).
            require("dynamo_reset")()
    return None if ops.higher_order else trace


def call_key(module: torch.nn.Module, args: tuple, kwargs: dict | None) -> tuple | None:
    """What one call ``module(*args, **kwargs)`` is, its module names left out: the class and
    training flag of each module and the shape, dtype and kind of each parameter and buffer,
    in ``named_modules()`` order; the inputs and outputs; every ATen op with its arguments'
    shapes, dtypes and scalar values, and every module call by its place in that order (as
    `plan_blocks` compares a repeat with its model). Two calls with equal keys count the same,
    module for module at equal places. None when the cheap pass cannot key the call (it fails,
    runs a higher-order op, or takes or returns an object)."""
    named = list(module.named_modules(remove_duplicate=False))
    place = {path: index for index, (path, _) in enumerate(named)}
    trace = _traced(module, args, kwargs or {}, {id(m): path for path, m in reversed(named)})
    if trace is None or not trace.calls or trace.calls[0].path is None:
        return None
    root = trace.calls[0]
    # By name: an fx GraphModule's class is made anew for each instance.
    tree = tuple((qualified_name(type(m)), m.training) for _, m in named)
    # Each parameter and buffer by its module's place and its own name, tied ones under each.
    tensors = tuple((place[owner], leaf, leaf_key(t), isinstance(t, torch.nn.Parameter))
                    for name, t in [*module.named_parameters(remove_duplicate=False),
                                    *module.named_buffers(remove_duplicate=False)]
                    for owner, _, leaf in [name.rpartition(".")])
    events = tuple((event[0], place[event[1]]) if event[0] in ("enter", "exit") else event
                   for event in trace.events)
    return tree, tensors, root.inputs, root.out_key, events


def _alike_modules(model: torch.nn.Module) -> bool:
    """Whether two modules, neither inside the other, have equal trees (`_tree_key`, the first
    thing a repeat and its model share). Only modules of a class that occurs twice are keyed."""
    named = list(model.named_modules())
    classes = Counter(type(module) for _, module in named)
    seen: dict[tuple, list[str]] = defaultdict(list)
    for path, module in named:
        if classes[type(module)] < 2:
            continue
        try:
            key = _tree_key(module)
        except Exception:  # a lazy module's parameter has no shape yet: let the pass decide
            return True
        if any(not _nested(other, path) for other in seen[key]):
            return True
        seen[key].append(path)
    return False


def _unique_paths(model: torch.nn.Module, owners: dict[int, set[str]]) -> dict[int, str | None]:
    """id(module) -> its path, for modules reachable by one path only (a shared module maps to
    None: it cannot be part of a repeat)."""
    return {id(module): path if len(owners[id(module)]) == 1 else None
            for path, module in model.named_modules()}


@dataclass
class _Call:
    path: str
    start: int
    inputs: tuple = ()
    end: int = -1
    out_key: tuple = ()
    grad_inputs: bool = False


class _Trace:
    """Module calls and ops, in the order they ran."""

    def __init__(self, paths: dict[int, str | None]) -> None:
        self.paths = paths
        self.events: list[tuple] = []
        self.calls: list[_Call] = []
        self.open: list[_Call] = []
        self.escaped: set[str] = set()
        """Paths some module below ran outside of: its calls do not hold all their work."""
        # The keys read tensors' sizes through torch functions, which `Functions` would see.
        self.unmoded = require("DisableTorchFunction")

    @contextlib.contextmanager
    def hooks(self, model: torch.nn.Module) -> Iterator[None]:
        """A pre-hook on each module (a global one is given no keyword arguments), and one
        global forward hook for all: registering a hook costs more than running one, and
        Llama-3-70B has 965 modules."""
        handles = []
        try:
            for module in model.modules():
                handles.append(module.register_forward_pre_hook(
                    self._enter(self.paths.get(id(module))), with_kwargs=True))
            handles.append(torch.nn.modules.module.register_module_forward_hook(
                self._exit, with_kwargs=True, always_call=True))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, path: str | None):
        above = ancestors(path)[:-1] if path is not None else []

        def hook(module, args, kwargs):
            with self.unmoded():
                self._entered(path, above, args, kwargs)
        return hook

    def _entered(self, path: str | None, above: list[str], args: tuple, kwargs: dict) -> None:
        call = _Call(path, len(self.events))
        try:
            leaves, spec = flattened_call(args, kwargs)
            call.inputs = (flat_key(leaves, spec), torch.is_grad_enabled(),
                           torch.is_inference_mode_enabled(), _autocast())
            call.grad_inputs = any(isinstance(t, torch.Tensor) and t.requires_grad
                                   for t in leaves)
        except Unique:
            call.path = None
        self.events.append(("enter", path))
        if above:
            running = {c.path for c in self.open}
            self.escaped.update(a for a in above if a not in running)
        self.calls.append(call)
        self.open.append(call)

    def _exit(self, module: torch.nn.Module, args: tuple, *kwargs_output: Any) -> None:
        """Every module's forward hook: ``(kwargs, output)`` after a call, ``(output,)`` after
        a call that raised (torch passes a global hook no keyword arguments then)."""
        with self.unmoded():
            self._exited(module, kwargs_output[-1])

    def _exited(self, module: torch.nn.Module, output: Any) -> None:
        path = self.paths.get(id(module), _OUTSIDE)
        if path is _OUTSIDE:  # a module of no model's tree (one the forward made): no pre-hook
            return
        call = self.open.pop()
        self.events.append(("exit", path))
        call.end = len(self.events)
        try:
            call.out_key = flat_key(*flattened_output(output))
        except Unique:
            call.path = None


#: The path of a module outside the model (None is a shared module's).
_OUTSIDE = object()


def _autocast() -> tuple:
    return tuple((device, torch.is_autocast_enabled(device),
                  torch.get_autocast_dtype(device)) for device in ("cpu", "cuda"))


def _outputs(out_key: tuple) -> Any:
    """A call's output as its stub must make it, read from its key (made for every call, where
    this is for the repeats alone): `leaf_key` keys a tensor by its shape, stride, dtype, device
    and ``requires_grad``, a plain value by its type and itself."""
    spec, *leaves = out_key
    return pytree.tree_unflatten([TensorSlot(k[0], k[2], k[3], k[4]) if len(k) == 5 else k[1]
                                  for k in leaves], spec)


def _choose(model: torch.nn.Module, owners: dict[int, set[str]], trace: _Trace) -> Plan:
    """Repeats chosen outermost first; a repeat and its model are never inside or around
    another repeat, and a repeat never around or inside a model. A call's model is the first
    call, in call order, with its key (`_Keys`)."""
    runs = Counter(call.path for call in trace.calls)
    once = [call for call in trace.calls
            if call.path and runs[call.path] == 1 and call.path not in trace.escaped]
    keys = _Keys(model, owners, trace, once)
    plan = Plan()
    repeats, taken = _Paths(), _Paths()  # the repeats; the repeats and their models
    for call in sorted(once, key=lambda c: c.path.count(".")):
        # Touching a repeat or a model (a call inside a block chosen already): never chosen,
        # so its key is never made (most calls of a stack of blocks).
        if taken.touches(call.path):
            continue
        first = keys.first(call)
        # A repeat's nodes are copied from its model's, which must all be traced.
        if first is None or _nested(first.path, call.path) or repeats.touches(first.path):
            continue
        plan.repeats[call.path] = Repeat(call.path, first.path, _outputs(call.out_key),
                                         call.grad_inputs)
        repeats.add(call.path)
        taken.add(call.path)
        taken.add(first.path)
    return plan


class _Keys:
    """Each call's first call with an equal key (tree, inputs, outputs and body), the keys made
    only as `_choose` asks: a call's key and those of the calls before it that it could equal."""

    def __init__(self, model: torch.nn.Module, owners: dict[int, set[str]], trace: _Trace,
                 once: list[_Call]) -> None:
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.owners, self.events = owners, trace.events
        # Calls that share no inputs, outputs and length with another cannot share the whole
        # key: its costly parts (a subtree's modules, a body of every op) are left unread.
        # Each outline is hashed once (a pytree spec's hash is Python): calls hold its number.
        numbers: dict[tuple, int] = {}
        self.outline: dict[int, int] = {}
        """id of each call -> the number of its outline."""
        self.alike: dict[int, list[_Call]] = defaultdict(list)
        for call in once:
            number = self.outline[id(call)] = numbers.setdefault(_outline(call), len(numbers))
            self.alike[number].append(call)
        self.keyed: dict[int, int] = defaultdict(int)
        """Outline number -> how many of its calls, in call order, are keyed."""
        self.first_of: dict[tuple, _Call] = {}
        self.key_of: dict[int, tuple | None] = {}
        """id of each keyed call -> its key; None for a call that cannot repeat (not private)."""

    def first(self, call: _Call) -> _Call | None:
        """The first call with ``call``'s key, or None when no other call can have it."""
        outline = self.outline[id(call)]
        alike = self.alike[outline]
        if len(alike) < 2:
            return None
        while id(call) not in self.key_of:
            earlier = alike[self.keyed[outline]]
            self.keyed[outline] += 1
            key = self._key(earlier, outline)
            self.key_of[id(earlier)] = key
            if key is not None:
                self.first_of.setdefault(key, earlier)
        key = self.key_of[id(call)]
        first = None if key is None else self.first_of[key]
        return None if first is call else first

    def _key(self, call: _Call, outline: int) -> tuple | None:
        """The tree, the inputs, the outputs (in the outline) and the body of the call."""
        if not _private(call.path, self.modules, self.owners):
            return None
        return outline, _tree_key(self.modules[call.path]), _body(self.events, call)


def _outline(call: _Call) -> tuple:
    """Part of what `_choose` keys a call by, cheap to read: its inputs, outputs and number of
    events."""
    return call.inputs, call.out_key, call.end - call.start


class _Paths:
    """Module paths, asked whether a path is one of them, inside one or around one."""

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.around: set[str] = set()
        """Every module above a member."""

    def add(self, path: str) -> None:
        self.members.add(path)
        self.around.update(ancestors(path)[:-1])

    def touches(self, path: str) -> bool:
        return path in self.around or any(p in self.members for p in ancestors(path))


def _nested(a: str, b: str) -> bool:
    """One path is the other or inside it."""
    return _inside(a, b) or _inside(b, a)


def _inside(path: str, container: str) -> bool:
    return path == container or path.startswith(container + ".")


def _owners(model: torch.nn.Module) -> dict[int, set[str]]:
    """id of every module, parameter and buffer -> the paths that reach it."""
    owners: dict[int, set[str]] = defaultdict(set)
    for path, module in model.named_modules(remove_duplicate=False):
        owners[id(module)].add(path)
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is not None:
                owners[id(tensor)].add(f"{path}.{name}" if path else name)
    return owners


def _private(path: str, modules: dict, owners: dict[int, set[str]]) -> bool:
    """Everything under the module is reachable through it alone, and nothing there has hooks
    or an instance forward."""
    for sub in modules[path].modules():
        if "forward" in sub.__dict__ or sub._forward_pre_hooks or sub._forward_hooks or \
                sub._backward_hooks or sub._backward_pre_hooks:
            return False
        tensors = [t for t in [*sub._parameters.values(), *sub._buffers.values()]
                   if t is not None]
        if any(not _inside(p, path) for item in [sub, *tensors] for p in owners[id(item)]):
            return False
    return True


def _tree_key(module: torch.nn.Module) -> tuple:
    """Each submodule's path, class and training flag; each parameter's, then each buffer's,
    name and `leaf_key`, as ``named_parameters`` and ``named_buffers`` name them (from the one
    walk of the tree: each of those walks it again)."""
    named = list(module.named_modules(remove_duplicate=False))
    return (
        tuple((path, type(sub), sub.training) for path, sub in named),
        tuple((f"{path}.{name}" if path else name, leaf_key(t), isinstance(t, torch.nn.Parameter))
              for members in ("_parameters", "_buffers") for path, sub in named
              for name, t in getattr(sub, members).items() if t is not None),
    )


def _body(events: list[tuple], call: _Call) -> tuple:
    """The call's events with module paths relative to it."""
    cut = len(call.path)
    return tuple(
        (event[0], event[1][cut:]) if event[0] in ("enter", "exit") and event[1] else event
        for event in events[call.start + 1:call.end - 1])
