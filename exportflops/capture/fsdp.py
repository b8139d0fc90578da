"""FSDP2 (``fully_shard``): the forward and backward of one rank, traced with ``make_fx`` on the
model's fake tensors.

Dynamo refuses the hooks ``fully_shard`` installs (they are ``torch._dynamo.disable``d) and AOT
autograd's functionalization refuses the storage resizes FSDP2 frees its unsharded parameters
with; eager FSDP2 on fake tensors runs, so ``make_fx`` records what it executes: each block's
parameter all-gather in its pre-forward hook, the arithmetic on the gathered parameters, and in
the backward the all-gathers again (parameters resharded after forward) and the reduce-scatter
of the gradients, as ``c10d`` ops. Module paths come from forward hooks held only while tracing;
a backward op gets the module stack of the forward op that created its autograd node (the
sequence number AOT autograd pairs them by); ``partitioner_tag`` marks the backward, as in the
joint graph of `exportflops.count.ranks`. FSDP2's own steps (the all-gathers, their copies, the
gradients' reduce-scatter) belong to the FSDP unit whose parameters they carry, which is not
always the module running: the backward prefetches the next unit's all-gather inside the
current one's, and the root's final callback reduce-scatters the gradients of a unit whose
input needed no gradient. FSDP2 names the unit in the profiler range around each step, and
the graph records those ranges (`_unit_stacks`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.utils.checkpoint import CheckpointError, CheckpointPolicy

from ..errors import DistributedError
from .quiet import quiet_capture_log
from ..torch_internals import get_sequence_nr, pytree, sequence_nr


def has_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextlib.contextmanager
def fsdp_graph(model: torch.nn.Module, args: tuple, kwargs: dict,
               train: bool) -> Iterator[torch.fx.Graph]:
    """The graph of one forward (and in train mode its backward) of this rank."""
    from ..torch_internals import detect_fake_mode, make_fx

    fake = detect_fake_mode(_local_tensors(model, args, kwargs))
    if fake is None:
        raise DistributedError(
            f"{type(model).__name__} uses FSDP2 (fully_shard), which refuses meta parameters: "
            f"build the model and its inputs inside torch._subclasses.FakeTensorMode() (on "
            f"cpu), then fully_shard it; nothing is allocated.")
    spans: list = []

    def step(*flat):
        out = model(*flat[:len(args)], **dict(zip(kwargs, flat[len(args):])))
        if train:
            outs = [o for o in pytree.tree_leaves(out)
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            _backward_stacks(outs, spans)
            fx_traceback.current_meta["partitioner_tag"] = "is_backward"
            fx_traceback.current_meta.pop("nn_module_stack", None)
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            # Returned, so the graph says which nodes hold them (`_mark_gradients`).
            return out, [a.grad for a in flat if isinstance(a, torch.Tensor)
                         and a.requires_grad and a.grad is not None]
        return out

    # Inputs needing a gradient become leaves of the trace's own: the backward stops there,
    # and nothing accumulates into the caller's tensors or what they were computed from.
    args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().requires_grad_() if t.requires_grad else t,
        (tuple(args), dict(kwargs)))
    with fake, fx_traceback.preserve_node_meta(), _module_stacks(model, spans), \
            quiet_capture_log(), torch.enable_grad() if train else torch.no_grad():
        try:
            graph = make_fx(step)(*args, *kwargs.values()).graph
        except DistributedError:
            raise
        except Exception as error:  # torch raises many types; all become one error
            hint = f" {SELECTIVE}" if isinstance(error, CheckpointError) else ""
            raise DistributedError(
                f"tracing {type(model).__name__}'s FSDP2 forward"
                f"{' and backward' if train else ''} on fake tensors failed: "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                f"{hint}") from error
        _unit_stacks(graph, model)
        if train:
            _mark_gradients(graph)
        yield graph


#: What to do when activation checkpointing fails the FSDP2 trace.
SELECTIVE = ("If the model checkpoints with a selective policy (a context_fn), that cannot "
             "be traced under FSDP2 as eager runs it (under make_fx it caches every output "
             "instead of rerunning): analyze the model without --fsdp (tensor parallel, or one "
             "device), or with plain checkpointing.")


def _mark_gradients(graph: torch.fx.Graph) -> None:
    """``meta["input_gradient"]`` on the nodes holding the gradients of the call's inputs,
    which the traced step returns after its output, and ``meta["parameter_gradient"]`` (its
    module) on each parameter's unsharded gradient, which FSDP2's reduce copies into the
    reduce-scatter's input (``fsdp.chunk_cat`` in torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py, ``foreach_reduce``): what `exportflops.graph.passes` splits the
    backward by."""
    _, gradients = graph.output_node().args[0]
    for node in gradients:
        node.meta["input_gradient"] = True
    for node in graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") \
                .startswith("chunk_cat") and getattr(node.target, "namespace", "") == "fsdp":
            for gradient in node.all_input_nodes:
                stack = gradient.meta.get("nn_module_stack") or {}
                gradient.meta["parameter_gradient"] = next(
                    (path for path, _ in reversed(stack.values())), "") or "a parameter"


#: The profiler range FSDP2 opens around one step of one unit (``FSDPParamGroup._with_fqn`` in
#: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): ``FSDP::all_gather (layers.0)``,
#: ``FSDP::post_backward_reduce (layers.0) [pg=2]``; the root unit's steps name no path.
_UNIT_STEP = re.compile(r"FSDP::(?:all_gather|all_gather_copy_out|pre_forward|post_forward|"
                        r"pre_backward|post_backward\w*)(?: \((.*)\))?(?: \[pg=\d+\])?")


def _unit_stacks(graph: torch.fx.Graph, model: torch.nn.Module) -> None:
    """Each op inside an FSDP2 step's profiler range gets the module stack of the unit the
    range names (the innermost such range; a prefetch opens one unit's step inside
    another's): the stack the unit's own ops have. A unit of several modules
    (``fully_shard([norm, head])``) names them all, ``model.norm, lm_head``: its first's."""
    stacks = {"": {}}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if stack:
            stacks.setdefault(next(reversed(stack.values()))[0], dict(stack))
    enter = torch.ops.profiler._record_function_enter_new.default
    open_steps: list[tuple[torch.fx.Node, str | None]] = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is enter:
            step = _UNIT_STEP.fullmatch(str(node.args[0]))
            open_steps.append((node, (step[1] or "").split(", ")[0] if step else None))
        elif node.args and any(node.args[0] is opened for opened, _ in open_steps):
            open_steps = [(opened, unit) for opened, unit in open_steps
                          if opened is not node.args[0]]  # the range's exit
        else:
            unit = next((unit for _, unit in reversed(open_steps) if unit is not None), None)
            if unit is not None:
                node.meta["nn_module_stack"] = (stacks[unit] if unit in stacks
                                              else _frame(unit, model))


def _frame(path: str, model: torch.nn.Module) -> dict:
    return {f"L__self___{path.replace('.', '_')}": (path, type(model.get_submodule(path)))}


def _local_tensors(model: torch.nn.Module, args: tuple, kwargs: dict) -> list:
    from torch.distributed.tensor import DTensor

    tensors = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    return tensors + [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


@contextlib.contextmanager
def _module_stacks(model: torch.nn.Module, spans: list) -> Iterator[None]:
    """While tracing, each op's ``nn_module_stack`` is the modules running it (hooks removed on
    exit). A module's pre-hook runs first and its forward hook last: the stack covers the
    hooks of the module (a row-parallel linear's output all-reduce, which tensor parallel
    issues in a forward hook), and the tensor hook on its outputs, which sets the stack in
    the backward, sits on what the module finally returns. ``spans`` gets (first, end, stack)
    of the autograd sequence numbers each module call created. A module's forward running in
    the backward is activation checkpointing's recomputation: its ops get
    ``meta["recompute"]``."""
    stack: list[tuple[str, tuple[str, type]]] = []
    starts: list[int] = []
    # (the stack depth where a recomputation began, the backward's module stack it interrupted)
    recomputing: list[tuple[int, dict]] = []
    handles = []

    def enter(path: str, module: torch.nn.Module):
        def hook(*_):
            if not recomputing and fx_traceback.current_meta.get("partitioner_tag") \
                    == "is_backward":
                recomputing.append(
                    (len(stack), fx_traceback.current_meta.get("nn_module_stack") or {}))
                # torch's own readers of this key take a policy (torch/fx/graph.py)
                fx_traceback.current_meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            stack.append((f"L__self___{path.replace('.', '_')}", (path, type(module))))
            fx_traceback.current_meta["nn_module_stack"] = dict(stack)
            starts.append(get_sequence_nr())
        return hook

    def leave(module, inputs, output):
        frames = dict(stack)
        spans.append((starts.pop(), get_sequence_nr(), frames))
        for tensor in pytree.tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
                tensor.register_hook(lambda grad, frames=frames: _set_stack(frames))
        stack.pop()
        fx_traceback.current_meta["nn_module_stack"] = dict(stack)
        if recomputing and len(stack) == recomputing[-1][0]:
            # the backward goes on where the recomputation (stopped early, or done) began
            fx_traceback.current_meta["nn_module_stack"] = recomputing.pop()[1]
            fx_traceback.current_meta.pop("recompute", None)

    for path, module in model.named_modules():
        if path:
            handles.append(module.register_forward_pre_hook(enter(path, module), prepend=True))
            handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _set_stack(frames: dict) -> None:
    fx_traceback.current_meta["nn_module_stack"] = frames


def _backward_stacks(outs: list, spans: list) -> None:
    """Each autograd node reachable from ``outs`` sets, when it runs, the module stack of the
    innermost module call that created it (FSDP's post-backward reduce-scatter runs in a node
    its pre-forward hook made); hooks live as long as the autograd nodes."""
    seen, pending = set(), [o.grad_fn for o in outs if o.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        number = sequence_nr(node)
        inside = [(first, frames) for first, end, frames in spans if first <= number < end]
        frames = max(inside, key=lambda span: span[0])[1] if inside else {}
        node.register_prehook(lambda grads, frames=frames: _set_stack(frames))
        pending.extend(fn for fn, _ in node.next_functions if fn is not None)
