"""The recompute of non-reentrant activation checkpointing, which an exported graph keeps no
trace of (`exportflops.capture.checkpointed`).

torch.utils.checkpoint's non-reentrant kind (``use_reentrant=False``, ``checkpoint_wrapper``'s
``NO_REENTRANT``, transformers' gradient checkpointing in that mode) reruns a region's forward
when the backward first unpacks a tensor it saved: every op up to the last one that saves a
tensor (``early_stop``, its default), less the ops a selective policy
(``create_selective_checkpoint_contexts``) saves, whose outputs come from its cache
(torch/utils/checkpoint.py, ``_checkpoint_hook``, ``_recomputation_hook``,
``_CachedTorchDispatchMode``). The joint graph AOT autograd traces of the model tags each op of
a region with its policy, as torch.compile plans it, and `exportflops.graph.walk.reruns` reads
from it the ops eager checkpointing reruns: those are counted here, each with the module it
runs in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch

from ..capture.checkpointed import checkpointed_modules
from ..capture.dtensor import rank_graph
from ..graph.walk import GraphRead, NodeCall, read_graph, reruns
from ..records.names import ancestors

#: Why a report with dynamic sizes leaves a non-reentrant region's recompute out: the joint
#: graph that says what reruns is traced at the example's sizes.
DYNAMIC_GAP = ("the recompute of non-reentrant activation checkpointing in {regions} is not "
               "counted with dynamic sizes (it is traced at fixed sizes): analyze at fixed "
               "sizes, or use flops_per_batch, which adds those regions' forward")


@contextlib.contextmanager
def rerun_calls(model: torch.nn.Module, args: tuple,
                kwargs: dict) -> Iterator[tuple[GraphRead, list[NodeCall]] | None]:
    """The calls non-reentrant checkpointing reruns in a training step of ``model``, named
    ``<op>.recompute``, with the joint graph they are read from (open while the caller counts
    them: its tensors belong to the trace's fake mode); None when no module runs in such a
    region. A region is non-reentrant as the capture marks it (`NodeCall.checkpoint_reentrant`,
    its every op); unmarked (a checkpoint inside another), as the eager search finds it
    (`checkpointed_modules`: the ops of the modules it calls, not a checkpointed lambda's
    own). Nor is a checkpoint called from a helper that no module's ``forward`` names found
    (`may_checkpoint`)."""
    regions = checkpointed_modules(model, args, kwargs) if may_checkpoint(model) else frozenset()
    if regions == frozenset():  # None: the eager search failed, the trace tells
        yield None
        return
    with rank_graph(model, args, kwargs, train=True) as graph:
        read = read_graph(graph)
        again = set(reruns(graph))
        yield read, [replace(call, name=f"{call.name}.recompute") for call in read.nodes
                     if call.node in again and _non_reentrant(call, regions or frozenset())]


def _non_reentrant(call: NodeCall, regions: frozenset[str]) -> bool:
    """Whether ``call`` runs in a non-reentrant region: the capture's mark, else whether a
    module it runs in is one of the eager search's ``regions``."""
    marked = call.checkpoint_reentrant
    if marked is not None:
        return not marked
    return not regions.isdisjoint(ancestors(call.module))


def checkpointed_regions(model: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """The non-reentrant regions' module paths, for `DYNAMIC_GAP` ("" when there are none)."""
    if not may_checkpoint(model):
        return ""
    regions = checkpointed_modules(model, args, kwargs)
    if regions is None:
        return ("its checkpointed modules (which an eager run on fake tensors finds, and "
                "which failed)")
    return ", ".join(sorted(regions))


def may_checkpoint(model: torch.nn.Module) -> bool:
    """Whether a module of ``model`` may run activation checkpointing: torch's
    ``CheckpointWrapper``, a transformers layer with ``gradient_checkpointing`` on, or a
    ``forward`` that names ``checkpoint`` (``torch.utils.checkpoint.checkpoint(...)``). The
    eager search `checkpointed_modules` costs about a forward on fake tensors (0.55 s of a 1.2 s
    training analysis of a 4-layer GPT-2 shape): it runs only where this says so."""
    from ..torch_internals import CheckpointWrapper

    for module in model.modules():
        code = getattr(type(module).forward, "__code__", None)
        if (isinstance(module, CheckpointWrapper) or getattr(module, "gradient_checkpointing",
                                                             False) is True
                or (code is not None and "checkpoint" in code.co_names)):
            return True
    return False
