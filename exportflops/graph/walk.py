"""The only reader of ``node.meta``: one `NodeCall` per ``call_function`` node of an exported graph.

Tensor arguments become `TensorMeta` (shape + dtype from the FakeTensor in ``meta["val"]``),
arguments are named by the op's schema, and symbolic sizes pass through as sympy expressions.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from .eager_heads import eager_inputs
from .flex_blocks import with_skipped_pairs
from .kinds import subgraph_kinds, tensor_kinds
from .opcall import ACTIVATION, OpCall, TensorMeta, bind_schema
from .sizes import shape_env, size_names, SizeSymbol, size_symbols
from .stacks import Stack, invoked_stacks, module_stack
from ..torch_internals import HigherOrderOperator, OpOverload
from .vmap import VmapLevels

#: Higher-order ops that run their subgraph exactly once per call (grad mode, autocast,
#: checkpoint, ...); `_iterations` says how often every other control-flow op runs its own.
RUN_ONCE = frozenset({"wrap", "wrap_with_set_grad_enabled", "wrap_with_autocast",
                      "wrap_activation_checkpoint", "tag_activation_checkpoint",
                      "invoke_subgraph", "hints_wrapper", "strict_mode"})
#: Every higher-order op whose subgraphs the walk reads as nodes of their own.
CONTROL_FLOW = frozenset({"cond", "map_impl", "scan", "associative_scan", "while_loop",
                          *RUN_ONCE})


@dataclass(frozen=True)
class NodeCall:
    """A call_function node as the formulas and the attribution see it."""

    name: str
    op: Any
    op_name: str
    call: OpCall
    stack: Stack
    region: str = ""
    """For an op inside a control-flow subgraph: which one, e.g. ``cond cond_1, true_graph_0``."""
    repeat: Any = 1
    """How many times the op runs per call: a map body's iterations; None when unknown (a
    while_loop's trip count)."""
    autograd_function: str = ""
    """For an op that ran inside the ``forward`` of a custom ``torch.autograd.Function``: the
    Function's qualified name. Export inlines that forward and drops the Function, so the
    backward autograd would run is the Function's own, not that of these ops."""
    node: torch.fx.Node | None = None
    """The graph node itself, for the backward tracer (None for an op autograd dispatched)."""
    eager_inputs: tuple[TensorMeta, ...] = ()
    """The tensors an eager run passes the op where the graph passes others
    (`eager_heads.eager_inputs`); empty when they are the same."""

    @property
    def module(self) -> str:
        return self.stack[-1].path if self.stack else ""

    @property
    def checkpoint_reentrant(self) -> bool | None:
        """Which activation checkpoint runs the op, as the capture marks its node (True:
        reentrant, False: non-reentrant); None outside a marked region."""
        return None if self.node is None else self.node.meta.get("checkpoint_reentrant")


@dataclass(frozen=True)
class GraphRead:
    nodes: list[NodeCall]
    symbols: list[SizeSymbol]
    renames: dict[sympy.Symbol, sympy.Symbol]
    """torch's size symbols -> the user's Dim names, for calls read later (backward ops)."""
    kinds: dict[torch.fx.Node, str]
    """What each node of the graph and its subgraphs holds (`WEIGHT` or `STATE`; activations
    absent), for the backward tracer to tell the weights its replayed ops read."""
    shape_env: Any
    """The shape env of the graph's fake tensors (None without any), for replays of its ops."""


def read_graph(graph: torch.fx.Graph, signature=None) -> GraphRead:
    """Every call_function node, with dynamic sizes renamed after the user's Dims; with the
    program's graph ``signature``, each tensor knows whether it is a weight, state or an
    activation (`kinds`). Subgraphs' tensors are activations."""
    env = shape_env(graph)
    renames = size_names(env) if env is not None else {}
    read: dict[torch.fx.Node, Any] = {}  # each node's value, read once for all its consumers
    kinds = tensor_kinds(graph, signature)
    # The Functions' lines are read only for a graph whose nodes keep their tracebacks (train
    # mode's export): a forward-only export keeps none (`capture.export.capture`).
    forwards = functools.cache(_function_forwards)
    nodes = list(_calls(graph, renames, read, kinds, _Scope(), forwards))
    return GraphRead(nodes, size_symbols(env, renames) if env is not None else [],
                     renames, kinds, env)


@dataclass(frozen=True)
class _Scope:
    """Where a (sub)graph runs: the control-flow op around it, if any."""

    prefix: str = ""
    stack: Stack = ()
    region: str = ""
    repeat: Any = 1
    rebased: Callable[[Stack], Stack] | None = None
    """For an ``invoke_subgraph`` body: its nodes' own stacks as the calling module sees them."""


def _calls(graph: torch.fx.Graph, renames: dict, read: dict, kinds: dict, scope: _Scope,
           forwards: Callable[[], dict[tuple[str, int], str]]) -> Iterator[NodeCall]:
    vmap = VmapLevels(lambda size: _size(size, renames))
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        # Subgraph nodes carry no module stack, except invoke_subgraph bodies (the first call's).
        own = module_stack(node)
        stack = (scope.rebased(own) if scope.rebased else own) if own else scope.stack
        batch = vmap.runs(node)
        region = scope.region if batch == 1 else ", ".join(filter(None, (scope.region, "vmap")))
        runs = None if scope.repeat is None else scope.repeat * batch
        call = with_skipped_pairs(node, op_call(node.target, node.args, node.kwargs,
                                                node.meta.get("val"), renames, read, kinds,
                                                kinds.get(node, ACTIVATION)))
        yield NodeCall(scope.prefix + node.name, node.target, op_name(node.target), call,
                       stack, region, runs,
                       _autograd_function(node.meta.get("stack_trace"), forwards), node,
                       eager_inputs(node, stack, call,
                                    lambda arg: _meta(arg, renames, read, kinds)))
        times = _iterations(node, renames)
        for attr, subgraph in subgraphs(node):
            repeat = None if times is None or runs is None else times * runs
            kind = node.target.name()
            inner = _Scope(f"{scope.prefix}{node.name}.{attr}.", stack,
                           f"{kind} {node.name}, {attr}", repeat,
                           invoked_stacks(subgraph, stack) if kind == "invoke_subgraph" else None)
            kinds.update(subgraph_kinds(node, subgraph, kinds))  # distinct nodes: one map
            yield from _calls(subgraph, renames, read, kinds, inner, forwards)


#: One frame of the traceback export keeps in ``meta["stack_trace"]``.
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in forward\b')


def _autograd_function(stack_trace: str | None,
                       forwards: Callable[[], dict[tuple[str, int], str]]) -> str:
    """The custom autograd.Function whose forward ran this op, from the frames export keeps
    (those named ``forward``: the modules' and the Functions'). Export records no other trace of
    the Function, strict or not. The outermost one counts: autograd records nothing inside it."""
    for frame in _FRAME.finditer(stack_trace or ""):
        name = forwards().get((frame["file"], int(frame["line"])))
        if name:
            return name
    return ""


def _function_forwards() -> dict[tuple[str, int], str]:
    """(file, line) of every line of the ``forward`` of each ``torch.autograd.Function`` subclass
    defined now -> its qualified name. Read per graph: a model may define its Functions late."""
    lines = {}
    pending = [torch.autograd.Function]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        forward = cls.__dict__.get("forward")  # a staticmethod, or absent when inherited
        function = getattr(forward, "__func__", forward)
        code = getattr(inspect.unwrap(function), "__code__", None) if function else None
        if code is not None:
            name = f"{cls.__module__}.{cls.__qualname__}"
            lines.update({(code.co_filename, line): name
                          for _, _, line in code.co_lines() if line is not None})
    return lines


def example_value(node: torch.fx.Node) -> Any:
    """The value torch recorded for ``node``'s output while tracing (``node.meta["val"]``): a
    fake tensor, a tuple of them, a SymInt, or None for a node without one."""
    return node.meta.get("val")


def phase(node: torch.fx.Node | None) -> str:
    """"backward" for a node of the backward half of a joint graph (AOT autograd's and
    FSDP2's captures tag them ``partitioner_tag="is_backward"``), else "forward"."""
    tag = node.meta.get("partitioner_tag") if node is not None else None
    return "backward" if tag == "is_backward" else "forward"


def recomputed(node: torch.fx.Node) -> bool:
    """Whether activation checkpointing may rerun this node in the backward: AOT autograd's
    joint graph tags each op of a checkpointed region with its policy (``meta["recompute"]``),
    and eager checkpointing, what runs without torch.compile, reruns the ops a selective policy
    does not save (``MUST_SAVE``, ``PREFER_SAVE``); FSDP2's capture traces the rerun itself and
    tags its ops too."""
    policy = node.meta.get("recompute")
    return policy is not None and getattr(policy, "name", "") not in ("MUST_SAVE", "PREFER_SAVE")


def reruns(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The forward nodes of a joint graph that eager activation checkpointing reruns in the
    backward: each checkpointed region's (``meta["ac_graph_id"]``) `recomputed` ops, a region
    that stops early only up to where it does. torch.utils.checkpoint's ``early_stop`` (its
    default, non-reentrant) stops the rerun at the last tensor the region's ops saved for the
    backward: the ops before the last op that saves one rerun, and that op too when it saves
    its outputs (an op saves its inputs before it computes). What an op saved is what the
    backward nodes of its autograd node (the same ``meta["seq_nr"]``) read of the forward. A
    region the capture marks ``meta["checkpoint_whole"]`` (reentrant, or ``early_stop=False``)
    reruns whole."""
    regions: dict[Any, list[torch.fx.Node]] = {}
    saved: dict[Any, set[torch.fx.Node]] = {}  # seq_nr -> the forward values its backward reads
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if phase(node) == "forward" and node.meta.get("ac_graph_id") is not None:
            regions.setdefault(node.meta["ac_graph_id"], []).append(node)
        elif phase(node) == "backward" and node.meta.get("seq_nr") is not None:
            saved.setdefault(node.meta["seq_nr"], set()).update(
                arg for arg in node.all_input_nodes if phase(arg) == "forward")
    rerun = []
    for nodes in regions.values():
        if not nodes[0].meta.get("checkpoint_whole"):
            nodes = _until_last_save(nodes, saved)
        rerun += [node for node in nodes if recomputed(node)]
    return rerun


def _until_last_save(nodes: list[torch.fx.Node], saved: dict) -> list[torch.fx.Node]:
    """A region's ``nodes`` an early-stopping rerun runs (`reruns`)."""
    saving = [i for i, node in enumerate(nodes) if saved.get(node.meta.get("seq_nr"))]
    if not saving:
        return []
    last = nodes[saving[-1]]
    outputs = {last} | {user for user in last.users if user.target is operator.getitem}
    return nodes[:saving[-1] + bool(outputs & saved[last.meta["seq_nr"]])]


def subgraphs(node: torch.fx.Node) -> Iterator[tuple[str, torch.fx.Graph]]:
    """The subgraphs a control-flow op runs."""
    if not isinstance(node.target, HigherOrderOperator):
        return
    owner = node.graph.owning_module
    for arg in node.args:
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            subgraph = getattr(owner, arg.target, None)
            if isinstance(subgraph, torch.fx.GraphModule):
                yield arg.target, subgraph.graph


def _iterations(node: torch.fx.Node, renames: dict) -> Any:
    """Runs of each subgraph per call: 1 for wrappers and for each branch of a cond (both are
    counted); a map or scan body once per slice of its inputs; flex attention's score_mod once
    per score; while_loop and any other: unknown at export time (None)."""
    if not isinstance(node.target, HigherOrderOperator):
        return 1
    name = node.target.name()
    if name == "cond" or name in RUN_ONCE:
        return 1
    if name == "map_impl":
        return _size(node.args[1][0].meta["val"].shape[0], renames)
    if name == "scan":
        return _size(node.args[2][0].meta["val"].shape[0], renames)
    if name == "flex_attention":
        query, key = (a.meta["val"] for a in node.args[:2])
        return _size(math.prod(query.shape[:-1]) * key.shape[-2], renames)
    return None


def op_name(target: Any) -> str:
    """``aten.mm.default`` for an OpOverload, ``getitem`` for a Python function."""
    if isinstance(target, OpOverload):
        namespace = target.namespace
        return f"{namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return getattr(target, "__name__", str(target))


def op_call(target: Any, args: tuple, kwargs: dict, result: Any, renames: dict,
            read: dict | None = None, kinds: dict | None = None,
            out_kind: str = ACTIVATION, kind_of: Callable | None = None) -> OpCall:
    """The `OpCall` of one call: arguments are fx nodes (read from their ``meta["val"]``, and
    kept in ``read``) or the (fake) values themselves, as the backward tracer records them.
    ``kinds`` maps nodes to what they hold (`kinds.tensor_kinds`; activations when absent), and
    the outputs hold ``out_kind``. A call of (fake) values says what each tensor holds through
    ``kind_of`` (tensor -> kind) instead."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        named = {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
    else:
        named = bind_schema(schema, args, kwargs)
    read = {} if read is None else read
    kinds = {} if kinds is None else kinds
    aliased = _aliases_argument(result, named.values())
    if kind_of is not None:
        return OpCall(target, {name: _tagged(value, renames, kind_of)
                               for name, value in named.items()},
                      tuple(_tagged(t, renames, kind_of) for t in _leaf_tensors(result)), aliased)
    metas = {name: _meta(value, renames, read, kinds) for name, value in named.items()}
    return OpCall(target, metas, tuple(_tensors(result, renames, out_kind)), aliased)


def _aliases_argument(result: Any, args: Iterable[Any]) -> bool:
    """Whether the first output shares storage with a tensor argument (an fx node's value or
    the value itself): ops such as ``reshape`` return a view when the strides allow, else a
    copy, and only the (fake) tensors know which."""
    out = next(_leaf_tensors(result), None)
    storage = storage_id(out)
    if storage is None:
        return False
    return any(storage_id(value.meta.get("val") if isinstance(value, torch.fx.Node) else value)
               == storage for value in args)


def storage_id(value: Any) -> int | None:
    """The identity of a strided tensor's storage; None for anything else (a subclass without
    one counts as a copy: its bytes are charged rather than silently dropped)."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    try:
        return value.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _tagged(value: Any, renames: dict, kind_of: Callable) -> Any:
    """A (fake) value as a formula sees it, each tensor holding ``kind_of(tensor)``."""
    if isinstance(value, torch.Tensor):
        return _meta(value, renames, {}, {}, kind_of(value))
    if isinstance(value, (list, tuple)):
        return type(value)(_tagged(v, renames, kind_of) for v in value)
    return _meta(value, renames, {}, {})


def _leaf_tensors(val: Any) -> Iterator[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        yield val
    elif isinstance(val, (list, tuple)):
        for v in val:
            yield from _leaf_tensors(v)


def _meta(value: Any, renames: dict, read: dict, kinds: dict, kind: str = ACTIVATION) -> Any:
    """An fx argument as a formula sees it: tensors as TensorMeta, sizes as int or sympy."""
    if isinstance(value, torch.fx.Node):
        if value not in read:
            read[value] = _meta(value.meta.get("val"), renames, read, kinds,
                                kinds.get(value, ACTIVATION))
        return read[value]
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(_size(d, renames) for d in value.shape), value.dtype, kind,
                          _broadcast(value), value.layout)
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v, renames, read, kinds, kind) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _size(value, renames)
    return value


def _broadcast(tensor: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of stride 0 of a strided tensor of more than one element per dimension."""
    if tensor.layout != torch.strided:
        return ()
    try:
        strides = tensor.stride()
    except (RuntimeError, NotImplementedError):
        return ()
    return tuple(i for i, (size, stride) in enumerate(zip(tensor.shape, strides))
                 if _is_zero(stride) and not _is_zero(size - 1))


def _is_zero(value: Any) -> bool:
    expr = value.node.expr if isinstance(value, torch.SymInt) else value
    return expr == 0


def _size(value: Any, renames: dict) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = value.node.expr
        if expr.is_number:
            return int(expr) if isinstance(value, torch.SymInt) else expr
        return expr.xreplace(renames)
    return value


def _tensors(val: Any, renames: dict, kind: str = ACTIVATION) -> Iterator[TensorMeta]:
    return (_meta(t, renames, {}, {}, kind) for t in _leaf_tensors(val))
