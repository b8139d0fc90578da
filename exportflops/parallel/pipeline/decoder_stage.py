"""A Hugging Face decoder's pipeline stages made of its own modules, as torchtitan splits a
model for pipeline parallelism (``pipeline_module_split``: each stage a copy holding its
layers), so that the model's tensor-parallel plan, keyed by module path, and FSDP2 apply to a
stage: torch's ``pipeline()`` split cannot take them, its stage modules are
``InterpreterModule``s (``parallelize_module``'s styles take ``nn.Linear`` and
``nn.Embedding`` only) whose graphs keep the head counts they were traced with
(``aten.expand`` of the key/value heads to ``[1, 2, 2, T, hd]``).

What a stage takes and returns is what `exportflops.parallel.pipeline.mesh.received_stages`
passes: the token ids (stage 0), else the hidden state and the rotary tables, which stage 0
computes and sends on. Each stage makes the causal mask again from its hidden state as the
model does (``create_causal_mask``: none under SDPA without padding, which then runs causal),
where torch's split, traced, sends the boolean mask it materialized.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture.pipeline_split import Stage
from ...errors import LayoutError
from .analysis import stage_layers
from .mesh import received_stages

#: The transformers model types whose decoder the stage runs as their base model's forward
#: does (each layer called on the hidden state, the full causal mask, the positions and the
#: rotary tables): transformers 5's ``LlamaModel.forward``.
MODELLED = ("llama",)


def decoder_stages(model: torch.nn.Module, tokens: torch.Tensor, stages: int, mode: str,
                   *, layout: Any) -> list[Stage]:
    """A transformers causal LM (one of `MODELLED`: ``model.model`` its decoder,
    ``model.lm_head`` its head) split into ``stages`` `DecoderStage`s of whole layers, with
    what each receives on one microbatch of ``tokens``; any other model refused, naming
    ``layout``."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in MODELLED or not hasattr(model, "lm_head"):
        raise LayoutError(
            f"{layout}: memory_ranks runs a pipeline with tp or fsdp on stages made of the "
            f"model's own modules, for the built-in Llama (exportflops.examples) and "
            f"transformers causal LMs of type {', '.join(MODELLED)}; "
            f"{type(model).__name__} (model_type {kind!r}) is not modelled yet: pass "
            f"Layout(pp=P) alone, or Layout(fsdp=F, tp=T) without pp.")
    held = stage_layers(len(model.model.layers), stages, model)
    return received_stages([DecoderStage(model, layers, first=s == 0, last=s == stages - 1)
                            for s, layers in enumerate(held)], tokens, mode)


class DecoderStage(torch.nn.Module):
    """One pipeline stage of a transformers causal LM made of the model's own modules, at the
    model's own paths (``model.layers.2.self_attn.q_proj``): the embedding and the rotary
    embedding on the first stage, the final norm and the head on the last."""

    def __init__(self, model: torch.nn.Module, held: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self.config = first, last, model.config
        #: The blocks FSDP2 shards one by one before the stage (`fully_shard_blocks`).
        self._no_split_modules = list(model._no_split_modules)
        decoder = model.model
        self.model = torch.nn.Module()
        if first:
            self.model.embed_tokens = decoder.embed_tokens
            self.model.rotary_emb = decoder.rotary_emb
        # Keyed by the model's own indices: the report's paths are the model's.
        self.model.layers = torch.nn.ModuleDict({str(i): decoder.layers[i] for i in held})
        if last:
            self.model.norm, self.lm_head = decoder.norm, model.lm_head

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None) -> Any:
        from transformers.masking_utils import create_causal_mask

        decoder = self.model
        if self.first:
            x = decoder.embed_tokens(x)  # (B, T, hidden)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
        if self.first:
            cos, sin = decoder.rotary_emb(x, position_ids=positions)  # (B, T, hd) each
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None,
                                  cache=None, position_ids=positions)
        for layer in decoder.layers.values():
            x = layer(x, attention_mask=mask, position_ids=positions,
                      position_embeddings=(cos, sin))
        if self.last:
            return self.lm_head(decoder.norm(x))  # (B, T, vocab)
        return (x, cos, sin) if self.first else x
