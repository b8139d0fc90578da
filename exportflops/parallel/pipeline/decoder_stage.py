"""A Hugging Face decoder's pipeline stages made of its own modules, as torchtitan splits a
model for pipeline parallelism (``pipeline_module_split``: each stage a copy holding its
layers), so that the model's tensor-parallel plan, keyed by module path, and FSDP2 apply to a
stage: torch's ``pipeline()`` split cannot take them, its stage modules are
``InterpreterModule``s (``parallelize_module``'s styles take ``nn.Linear`` and
``nn.Embedding`` only) whose graphs keep the head counts they were traced with
(``aten.expand`` of the key/value heads to ``[1, 2, 2, T, hd]``).

What a stage takes and returns is what `exportflops.parallel.pipeline.mesh.received_stages`
passes: the token ids (stage 0), else the hidden state and the rotary tables, which stage 0
computes and sends on. Each stage makes its layers' masks again from its hidden state as the
model does (``create_causal_mask``: none under SDPA without padding, which then runs causal;
``create_sliding_window_causal_mask`` for a sliding-window layer), where torch's split,
traced, sends the boolean mask it materialized.

`DECODERS` says, per transformers model type, how its base model's forward and its head
differ from Llama's: which mask each layer takes, a step after the embedding, a step after
the head. A type whose forward differs otherwise (rotary tables per layer kind: Gemma 3,
OLMo 3; a norm before the layers: NanoChat) is not in it, and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ...capture.pipeline_split import Stage
from ...errors import LayoutError
from .analysis import stage_layers
from .mesh import received_stages

#: The mask kinds of transformers' ``config.layer_types`` a stage makes, each by the
#: function of ``transformers.masking_utils`` of that name.
_MASKS = {"full_attention": "create_causal_mask",
          "sliding_attention": "create_sliding_window_causal_mask"}


def _causal(config: Any, layers: int) -> list[str]:
    """Every layer on the causal mask (``LlamaModel.forward``)."""
    return ["full_attention"] * layers


def _windowed(config: Any, layers: int) -> list[str]:
    """Every layer on the sliding-window mask where ``config.sliding_window`` is set, else on
    the causal one (``MistralModel.forward``'s ``mask_function``)."""
    return [("full_attention" if config.sliding_window is None else "sliding_attention")
            ] * layers


def _by_layer_type(config: Any, layers: int) -> list[str]:
    """Layer ``i`` on the mask of ``config.layer_types[i]`` (``Qwen2Model.forward``'s
    ``causal_mask_mapping``)."""
    return list(config.layer_types[:layers])


def _multiplied(x: torch.Tensor, config: Any, training: bool) -> torch.Tensor:
    return x * config.embedding_multiplier  # GraniteModel.forward


def _dropped_out(x: torch.Tensor, config: Any, training: bool) -> torch.Tensor:
    # Starcoder2Model.forward: the embedding's dropout, in training only
    return torch.nn.functional.dropout(x, p=config.embedding_dropout, training=training)


def _scaled(logits: torch.Tensor, config: Any) -> torch.Tensor:
    return logits * config.logit_scale  # CohereForCausalLM.forward


def _divided(logits: torch.Tensor, config: Any) -> torch.Tensor:
    return logits / config.logits_scaling  # GraniteForCausalLM.forward


def _softcapped(logits: torch.Tensor, config: Any) -> torch.Tensor:
    # Gemma2ForCausalLM.forward: cap * tanh(logits / cap), where a cap is set
    cap = config.final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap


@dataclasses.dataclass(frozen=True)
class Decoder:
    """How a transformers type's base model forward and head run beside ``LlamaModel``'s and
    ``LlamaForCausalLM``'s, the steps of a `DecoderStage` (each a function of the config)."""

    #: ``(config, layers) ->`` each layer's mask kind, a key of `_MASKS`.
    masks: Callable[[Any, int], list[str]] = _causal
    #: ``(embeddings, config, training) ->`` the hidden state the first layer takes.
    embedded: Callable[[torch.Tensor, Any, bool], torch.Tensor] | None = None
    #: ``(logits, config) ->`` the logits the causal LM returns.
    logits: Callable[[torch.Tensor, Any], torch.Tensor] | None = None


#: transformers 5's causal LMs whose base model's forward is ``LlamaModel``'s (the embedding,
#: the rotary tables from the positions, each layer called on the hidden state, its mask, the
#: positions and the tables, the final norm) but for the `Decoder` steps given, and whose head
#: is ``lm_head`` on every position (read from each ``modeling_<type>.py``; each checked
#: against the model's logits in tests/parallel/test_decoder_stages.py).
DECODERS = {
    **dict.fromkeys(("llama", "apertus", "arcee", "bitnet", "diffllama", "ernie4_5", "gemma",
                     "glm", "glm4", "helium", "hunyuan_v1_dense", "jais2", "olmo", "olmo2",
                     "seed_oss"), Decoder()),
    **dict.fromkeys(("mistral", "ministral3", "phi3"), Decoder(masks=_windowed)),
    "starcoder2": Decoder(masks=_windowed, embedded=_dropped_out),
    **dict.fromkeys(("qwen2", "qwen3", "smollm3", "ministral", "exaone4"),
                    Decoder(masks=_by_layer_type)),
    "gemma2": Decoder(masks=_by_layer_type, logits=_softcapped),
    "cohere": Decoder(logits=_scaled),
    "cohere2": Decoder(masks=_by_layer_type, logits=_scaled),
    "granite": Decoder(embedded=_multiplied, logits=_divided),
}

#: The transformers model types `decoder_stages` splits (`DECODERS`).
MODELLED = tuple(sorted(DECODERS))


def decoder_stages(model: torch.nn.Module, tokens: torch.Tensor, stages: int, mode: str,
                   *, layout: Any) -> list[Stage]:
    """A transformers causal LM (one of `MODELLED`: ``model.model`` its decoder,
    ``model.lm_head`` its head) split into ``stages`` `DecoderStage`s of whole layers, with
    what each receives on one microbatch of ``tokens``; any other model, or one with a
    layer on a mask kind no stage makes (not in `_MASKS`), refused, naming ``layout``."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in DECODERS or not hasattr(model, "lm_head"):
        raise LayoutError(
            f"{layout}: memory_ranks runs a pipeline with tp or fsdp on stages made of the "
            f"model's own modules, for the built-in Llama (exportflops.examples) and "
            f"transformers causal LMs of type {', '.join(MODELLED)}; "
            f"{type(model).__name__} (model_type {kind!r}) is not modelled yet: pass "
            f"Layout(pp=P) alone, or Layout(fsdp=F, tp=T) without pp.")
    count = len(model.model.layers)
    masks = DECODERS[kind].masks(config, count)
    unknown = sorted(set(masks) - set(_MASKS))
    if unknown:
        raise LayoutError(
            f"{layout}: {type(model).__name__}'s config.layer_types hold {', '.join(unknown)}, "
            f"masks a pipeline stage does not make (it makes {', '.join(_MASKS)}): pass "
            f"Layout(pp=P) alone, or Layout(fsdp=F, tp=T) without pp.")
    held = stage_layers(count, stages, model)
    return received_stages([DecoderStage(model, layers, masks, first=s == 0,
                                         last=s == stages - 1)
                            for s, layers in enumerate(held)], tokens, mode)


class DecoderStage(torch.nn.Module):
    """One pipeline stage of a transformers causal LM (a type of `DECODERS`) made of the
    model's own modules, at the model's own paths (``model.layers.2.self_attn.q_proj``): the
    embedding and the rotary embedding on the first stage, the final norm and the head on the
    last; ``masks``: every layer's mask kind (`Decoder.masks`)."""

    def __init__(self, model: torch.nn.Module, held: range, masks: list[str], first: bool,
                 last: bool) -> None:
        super().__init__()
        self.first, self.last, self.config = first, last, model.config
        self.steps = DECODERS[model.config.model_type]
        #: The blocks FSDP2 shards one by one before the stage (`fully_shard_blocks`).
        self._no_split_modules = list(model._no_split_modules)
        decoder = model.model
        self.model = torch.nn.Module()
        if first:
            self.model.embed_tokens = decoder.embed_tokens
            self.model.rotary_emb = decoder.rotary_emb
        # Keyed by the model's own indices: the report's paths are the model's.
        self.model.layers = torch.nn.ModuleDict({str(i): decoder.layers[i] for i in held})
        self.masks = {str(i): masks[i] for i in held}
        if last:
            self.model.norm, self.lm_head = decoder.norm, model.lm_head

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None) -> Any:
        from transformers import masking_utils

        decoder, steps = self.model, self.steps
        if self.first:
            x = decoder.embed_tokens(x)  # (B, T, hidden)
            if steps.embedded is not None:
                x = steps.embedded(x, self.config, self.training)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
        if self.first:
            cos, sin = decoder.rotary_emb(x, position_ids=positions)  # (B, T, hd) each
        masks = {kind: getattr(masking_utils, _MASKS[kind])(
                     config=self.config, inputs_embeds=x, attention_mask=None, cache=None,
                     position_ids=positions)
                 for kind in set(self.masks.values())}  # one of each kind, as the model
        for i, layer in decoder.layers.items():
            x = layer(x, attention_mask=masks[self.masks[i]], position_ids=positions,
                      position_embeddings=(cos, sin))
        if self.last:
            logits = self.lm_head(decoder.norm(x))  # (B, T, vocab)
            return logits if steps.logits is None else steps.logits(logits, self.config)
        return (x, cos, sin) if self.first else x
