"""One rank's report of a whole model cut into the pipeline stages torch's split makes: how a
tensor-parallel rank of each stage is counted for a model whose stages are not built from its
own modules (a Hugging Face decoder: `exportflops.parallel.pipeline.ranks`).

torch's ``pipeline()`` traces fixed head counts into its stage graphs, so a tensor-parallel plan
cannot be applied to them; the plan is applied to the whole model instead, one rank of it is
counted, and its nodes are cut as the split cuts the program (``SplitPoint.BEGINNING``):

- a forward node is the stage of the last split point whose module had begun to run by then
  (stage 0 before the first): the program in order, cut where each split point's module
  starts, as the split cuts it;
- a backward node is the stage of the forward node it differentiates, else of its module when
  that module's forward ran in one stage, else of the backward node before it (the backward
  runs the stages last to first);
- a collective is its node's stage;
- a parameter is every stage whose module of torch's split holds it (a tied embedding and head
  in the first stage and the last, as torch's split leaves them).

Each stage's count is its nodes, selected from the rank's count (a `Counted`), with the
parameters it holds (this rank's shards, a tied one at its first name in the stage): its report
is built from it as `exportflops.analyze` builds one from a whole count (`build_report`). A
plan's layers end replicated, so the stages pass what the unsplit rank passes between its
layers: the sends and receives of torch's split of the unparallelized model.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ...aggregate import Counted
from ...attribution import ModuleInfo, module_tree
from ...count.ranks import local_parameters, rank_runs
from ...capture.pipeline_split import Stage
from ...errors import InputError
from ...graph.walk import read_graph
from ...records import NodeRecord, TensorSpec
from ...records.names import ancestors
from ...torch_internals import pytree
from ..fsdp_blocks import blocks_of


class _Placed(NamedTuple):
    """What places a node in a stage: a `NodeRecord`'s fields of the same names."""

    name: str
    phase: str
    module: str
    differentiates: str


def node_stages(counted: Counted, split_points: list[str]) -> dict[str, int]:
    """Each node of ``counted`` -> the stage it runs in, for a split before each module path
    of ``split_points``."""
    return _stages(counted.nodes, split_points, counted.model)


def graph_stages(graph: torch.fx.Graph, split_points: list[str], model: str,
                 ) -> dict[str, int]:
    """Each node of a rank's traced ``graph`` (of ``model``) -> its stage, as `node_stages`
    places the nodes of the rank's count of that graph (one record per call the rank runs, in
    the same order, with the backward whole): what cuts the rank's backward at the stages'
    inputs (`exportflops.graph.passes.stage_input_way`) while that count is being made, with
    no count of the rank before it."""
    runs = rank_runs(graph, read_graph(graph).nodes, train=True, split=False)
    return _stages([_Placed(run.call.name, run.phase, run.call.module, run.differentiates)
                    for run in runs], split_points, model)


def _stages(nodes: Sequence[NodeRecord | _Placed], split_points: list[str], model: str,
            ) -> dict[str, int]:
    forward = [n for n in nodes if n.phase == "forward"]
    starts = []
    for point in split_points:
        first = next((i for i, n in enumerate(forward) if point in ancestors(n.module)), None)
        if first is None:
            raise InputError(f"{model}'s module {point!r} runs no node: it cannot start "
                             f"a pipeline stage; give split points that run")
        starts.append(first)
    if starts != sorted(starts):
        raise InputError(f"{model}'s split points {split_points} do not run in that "
                         f"order: give them in the order the forward runs them")
    stage_of = {n.name: bisect.bisect_right(starts, i) for i, n in enumerate(forward)}
    ran_in: dict[str, set[int]] = defaultdict(set)  # module -> the stages its forward ran in
    for node in forward:
        ran_in[node.module].add(stage_of[node.name])
    current = len(split_points)
    for node in (n for n in nodes if n.phase == "backward"):
        if node.differentiates in stage_of:
            current = stage_of[node.differentiates]
        elif len(ran_in[node.module]) == 1:
            (current,) = ran_in[node.module]
        stage_of[node.name] = current
    return stage_of


def stage_counted(counted: Counted, stage: int, stage_of: dict[str, int],
                  parameters: list[tuple[str, torch.Tensor]], inputs: list[TensorSpec],
                  ) -> Counted:
    """The count of stage ``stage``, selected from the rank's ``counted``: its nodes
    (`node_stages`) and collectives, the ``parameters`` it holds, (name, this rank's shard) as
    `local_parameters` gives them, and the ``inputs`` it receives (`received`)."""
    nodes = [n for n in counted.nodes if stage_of[n.name] == stage]
    tree, tied = module_tree([], parameters, None, counted.tree[""].type_name)
    for path in {a for n in nodes for a in ancestors(n.module)} - set(tree):
        tree[path] = ModuleInfo(path)
    for path, info in tree.items():
        if path in counted.tree:
            info.type_name, info.calls = counted.tree[path].type_name, counted.tree[path].calls
    tree = dict(sorted(tree.items(), key=lambda item: (item[1].depth, item[0])))
    collectives = [c for c in counted.collectives if stage_of.get(c.node) == stage]
    return dataclasses.replace(counted, nodes=nodes, tree=tree, tied=tied, inputs=inputs,
                               collectives=collectives)


def received(stage: Stage) -> list[TensorSpec]:
    """The tensors torch's split ``stage`` receives, as a report's inputs."""
    return [TensorSpec.of(t.shape, t.dtype) for t in pytree.tree_leaves((stage.args, stage.kwargs))
            if isinstance(t, torch.Tensor)]


def stage_units(model: torch.nn.Module, split_points: list[str],
                ) -> list[list[torch.nn.Module]]:
    """Per stage of a split before each of ``split_points``, the modules outside the blocks
    (`blocks_of`) that hold parameters of their own and run in it: the FSDP2 unit torchtitan's
    per-stage ``fully_shard`` gives each stage's root. A module before the first block runs in
    the first stage (the embedding), one after it in the last (the final norm, the head).
    `node_stages` checks afterwards that each ran there."""
    blocks = blocks_of(model)
    inside = {id(m) for block in blocks for m in block.modules()}
    order = {id(m): i for i, m in enumerate(model.modules())}
    first_block = min((order[id(b)] for b in blocks), default=0)
    units: list[list[torch.nn.Module]] = [[] for _ in range(len(split_points) + 1)]
    owner: dict[int, int] = {}
    for path, module in model.named_modules():
        if id(module) in inside or not any(True for _ in module.parameters(recurse=False)):
            continue
        stage = 0 if order[id(module)] < first_block else len(split_points)
        for parameter in module.parameters(recurse=False):
            if owner.setdefault(id(parameter), stage) != stage:
                raise InputError(f"{type(model).__name__}'s parameter of {path!r} is tied to one "
                                 f"in another stage (tied embeddings): each stage would hold it, "
                                 f"which FSDP2 cannot shard as one parameter in two units; build "
                                 f"the model untied (tie_word_embeddings=False) for pp= with "
                                 f"fsdp=")
        units[stage].append(module)
    return units


def held_parameters(model: torch.nn.Module, stage: torch.nn.Module,
                    ) -> list[tuple[str, torch.Tensor]]:
    """(name, ``model``'s local shard) of each parameter torch's split ``stage`` holds, in its
    ``named_parameters()`` order, every name of a tied one (the stage keeps the model's
    names)."""
    local = dict(local_parameters(model))
    return [(name, local[name]) for name, _ in stage.named_parameters(remove_duplicate=False)
            if name in local]
