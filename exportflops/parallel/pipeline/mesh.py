"""A pipeline on the mesh (pp, fsdp, tp): a global rank's report, built from its stage's count
(each stage's rank stands for its (fsdp, tp) group: `count_pipeline`'s ``fsdp`` and ``tp``),
and the built-in Llama's stages built from its own modules, so that a tensor-parallel plan or
FSDP2 applied to the model holds in each stage (`exportflops.parallel.pipeline` splits and
counts; `exportflops.parallel.pipeline.ranks` composes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...aggregate import build_report
from ...capture.pipeline_split import Stage, as_received
from ...records import Report
from ..layout import Layout
from .analysis import PipelineAnalysis, stage_layers


def rank_report(analysis: PipelineAnalysis, rank: int) -> Report:
    """The report of global ``rank`` of ``analysis`` (stages on the mesh (pp, fsdp, tp),
    `count_pipeline`'s ``fsdp`` and ``tp``): its pipeline rank's first stage, as its
    representative counted it (the same work), its sends and receives going to the ranks of
    its own fsdp and tp index on the other stages."""
    record = analysis.record
    layout = Layout(pp=record.pp, fsdp=record.fsdp, tp=record.tp)
    width = record.fsdp * record.tp
    counted = analysis.stage_counts[record.ranks[layout.coordinates(rank)["pp"]].stages[0]]
    # A peer is named by its stage's representative: here the rank of this one's index (a
    # rank's view of the sends its stage's ranks share).
    return build_report(dataclasses.replace(counted, rank=rank, collectives=[
        c.model_copy(update={"peer": c.peer + rank % width}) if c.mesh_dim == "pp" else c
        for c in counted.collectives]))


def llama_stages(model: torch.nn.Module, tokens: torch.Tensor, stages: int,
                 mode: str = "train") -> list[Stage]:
    """The built-in Llama split into ``stages`` `LlamaStage`s of whole layers, with what each
    receives on one microbatch of ``tokens`` (`received_stages`)."""
    held = stage_layers(len(model.layers), stages, model)
    return received_stages([LlamaStage(model, layers, first=s == 0, last=s == stages - 1)
                            for s, layers in enumerate(held)], tokens, mode)


def received_stages(modules: list[torch.nn.Module], tokens: torch.Tensor, mode: str,
                    ) -> list[Stage]:
    """``modules``, a decoder's stages of its own modules in order, with what each receives
    on one microbatch of ``tokens`` as torch's split passes it (`split_stages`): the hidden
    state from the stage before, the rotary tables from stage 0, which returns (hidden, cos,
    sin) (their gradients in ``mode="train"``: the hidden state's)."""
    split = [Stage(modules[0], (tokens,), None, [None])]
    grad = mode == "train"
    with torch.enable_grad() if grad else torch.no_grad():
        hidden, cos, sin = (as_received(t, grad) for t in modules[0](tokens)) \
            if len(modules) > 1 else (None, None, None)
        for s, module in enumerate(modules[1:], start=1):
            split.append(Stage(module, (hidden, cos, sin), None, [s - 1, 0, 0]))
            if s < len(modules) - 1:
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
