"""A pipeline on the mesh (pp, fsdp, tp): each stage's rank standing for its (fsdp, tp) group,
a global rank's report, and the built-in Llama's stages built from its own modules, so that a
tensor-parallel plan or FSDP2 applied to the model holds in each stage
(`exportflops.parallel.pipeline` splits and counts; `exportflops.parallel.pipeline.ranks`
composes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...capture.pipeline_split import Stage, as_received
from ...records import Report
from ...records.pipeline import PipelineReport
from ..layout import Layout
from .analysis import PipelineAnalysis, stage_layers


def on_mesh(analysis: PipelineAnalysis, fsdp: int, tp: int) -> PipelineAnalysis:
    """``analysis``, each stage counted as one rank of its (fsdp, tp) group (fsdp and tp index
    0), placed on the mesh (pp, fsdp, tp): the record names the ranks each stage stands for,
    each stage's report is its representative's, with the world and the peers in global
    ranks."""
    width = fsdp * tp
    record = analysis.record
    stages = [stage.model_copy(update={"stands_for": list(range(stage.rank * width,
                                                                (stage.rank + 1) * width))})
              for stage in record.stages]
    record = record.model_copy(update={"tp": tp, "fsdp": fsdp, "stages": stages})
    # A stage's report names its peers by pipeline rank: on the mesh, the representatives'.
    reports = [_as_rank(report, record, stage.stands_for[0], lambda peer: peer * width)
               for stage, report in zip(stages, analysis.stage_reports)]
    return PipelineAnalysis(record, reports)


def rank_report(analysis: PipelineAnalysis, rank: int) -> Report:
    """The report of global ``rank`` of `on_mesh`'s ``analysis``: its pipeline rank's first
    stage, as its representative counted it (the same work), its sends and receives going to
    the ranks of its own fsdp and tp index on the other stages."""
    record = analysis.record
    layout = Layout(pp=record.pp, fsdp=record.fsdp, tp=record.tp)
    width = record.fsdp * record.tp
    stage = record.ranks[layout.coordinates(rank)["pp"]].stages[0]
    return _as_rank(analysis.stage_reports[stage], record, rank,
                    lambda peer: peer // width * width + rank % width)


def _as_rank(report: Report, record: PipelineReport, rank: int,
             peer_of: Callable[[int], int]) -> Report:
    """``report`` as global ``rank``'s: the world is the mesh, each send's and receive's peer
    is ``peer_of(its peer)``."""
    collectives = [c.model_copy(update={"peer": peer_of(c.peer)}) if c.mesh_dim == "pp" else c
                   for c in report.collectives]
    return report.model_copy(update={"world_size": record.world_size(), "rank": rank,
                                     "collectives": collectives})


def llama_stages(model: torch.nn.Module, tokens: torch.Tensor, stages: int,
                 mode: str = "train") -> list[Stage]:
    """The built-in Llama split into ``stages`` `LlamaStage`s of whole layers, with what each
    receives on one microbatch of ``tokens`` as torch's split passes it (`split_stages`): the
    hidden state from the stage before, the rotary tables from stage 0 (their gradients in
    ``mode="train"``: the hidden state's)."""
    held = stage_layers(len(model.layers), stages, model)
    modules = [LlamaStage(model, layers, first=s == 0, last=s == stages - 1)
               for s, layers in enumerate(held)]
    split = [Stage(modules[0], (tokens,), None, [None])]
    grad = mode == "train"
    with torch.enable_grad() if grad else torch.no_grad():
        hidden, cos, sin = (as_received(t, grad) for t in modules[0](tokens)) if stages > 1 \
            else (None, None, None)
        for s, module in enumerate(modules[1:], start=1):
            split.append(Stage(module, (hidden, cos, sin), None, [s - 1, 0, 0]))
            if s < stages - 1:
                hidden = as_received(module(hidden, cos, sin), grad)
    return split


class LlamaStage(torch.nn.Module):
    """One pipeline stage of the built-in Llama (`exportflops.examples.llama.Llama`) made of
    the model's own modules, so a tensor-parallel plan or FSDP2 applied to the model holds in
    the stage (torch's ``pipeline()`` traces fixed head counts into its stage graphs). It takes
    what the stage of torch's split takes: the tokens (stage 0), else the hidden state and the
    rotary tables, and returns what it sends on (stage 0 the rotary tables too)."""

    #: The blocks FSDP2 shards one by one before the stage (`exportflops.parallel.parallelize`).
    _no_split_modules = ["TransformerBlock"]

    def __init__(self, model: torch.nn.Module, held: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.logits_last_only = model.config.logits_last_only
        if first:
            self.rope, self.tok_embeddings = model.rope, model.tok_embeddings
        # Keyed by the model's own indices: the report's paths are the model's (layers.2).
        self.layers = torch.nn.ModuleDict({str(i): model.layers[i] for i in held})
        if last:
            self.norm, self.output = model.norm, model.output

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None) -> Any:
        if self.first:
            cos, sin = self.rope(x.shape[1], x.device)  # (T, hd) each
            x = self.tok_embeddings(x)  # (B, T, dim)
        for layer in self.layers.values():
            x, _ = layer(x, cos, sin)
        if self.last:
            x = self.norm(x)
            return self.output(x[:, [-1], :] if self.logits_last_only else x)
        return (x, cos, sin) if self.first else x
