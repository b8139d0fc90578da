"""Generation with a Hugging Face encoder-decoder model (T5, BART, Whisper's text decoder...):
the encoder runs once, in the prefill, with the decoder's first step (its start token); each
later token is one decoder step whose self-attention cache holds ``past`` entries (the decoder's
own tokens) and whose cross-attention cache, the encoder's keys and values, stays constant.

transformers 5.23 registers no pytree for `EncoderDecoderCache`, so torch.export cannot take
one as an input or return one; its ``Seq2SeqLMExportableModule`` exports the decoder with a
static self-attention cache and a fresh cross-attention cache, recomputing the encoder's keys
and values at every step. The two wrappers here pass the caches as plain tensors instead and
build the `EncoderDecoderCache` inside the call with transformers' own constructors; nothing
in transformers is patched. Their module paths carry the wrapper's ``model.`` prefix.
"""

from __future__ import annotations

import math

import torch

from ..api import count_captured
from .cache_names import cache_argument, returned_cache
from ..capture.export import capture_forward
from .forked import beside
from ..records import Cost, Report
from ..records.generation import PAST
from ..records.symbolic import size_symbol
from ..graph.program_edits import drop_cache_rebuild, name_input_sizes
from ..torch_internals import FakeTensorMode


class _Prefill(torch.nn.Module):
    """The encoder over the prompts and the decoder's first step; returns the logits and both
    caches as tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, decoder_input_ids: torch.Tensor) -> tuple:
        # The encoder's input: token ids, or input features (Whisper).
        out = self.model(**{self.model.main_input_name: inputs},
                         decoder_input_ids=decoder_input_ids, use_cache=True)
        return out.logits, _tensors(returned_cache(out))


class _Step(torch.nn.Module):
    """One decoder step after ``keys``/``values`` (self-attention, per layer) with the
    encoder's output and its cross-attention ``cross_keys``/``cross_values``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_hidden_states, keys, values, cross_keys,
                cross_values) -> tuple:
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(list(zip(keys, values))),
                                    DynamicCache(list(zip(cross_keys, cross_values))))
        out = self.model(encoder_outputs=(encoder_hidden_states,), use_cache=True,
                         decoder_input_ids=decoder_input_ids,
                         **{cache_argument(self.model): cache})
        return out.logits, _tensors(returned_cache(out))[:2]


def _tensors(cache) -> tuple[list, list, list, list]:
    own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
    return ([layer.keys for layer in own], [layer.values for layer in own],
            [layer.keys for layer in cross], [layer.values for layer in cross])


def seq2seq(model, input_ids: torch.Tensor, options: dict) -> tuple:
    """The prefill, the decode step (a polynomial in ``past``, the decoder tokens cached), the
    step's KV cache bytes, the cache-rebuild nodes left out of it, and no sliding-window
    fields. ``input_ids`` are the encoder's input: token ids, or input features (Whisper)."""
    start = torch.zeros(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
    with beside(lambda: count_captured(capture_forward(_Prefill(model), (input_ids, start)),
                                       **options), (model, input_ids)) as prefill:
        step = _step(model, input_ids, start, options)
        return (prefill(), *step, {})


def _step(model, input_ids: torch.Tensor, start: torch.Tensor,
          options: dict) -> tuple[Report, Cost, list[str]]:
    """The decode step's report, its KV cache bytes and the cache-rebuild nodes left out."""
    batch, device = input_ids.shape[0], input_ids.device
    # The caches as transformers builds them (layers, heads, head dim, dtype), on fake tensors.
    with FakeTensorMode(allow_non_fake_inputs=True):
        _, (keys, values, cross, _) = _Prefill(model)(input_ids, start)
    encoded = cross[0].shape[2]  # the encoder's positions: prompt tokens, or Whisper's frames/2
    width = getattr(model.config, "d_model", None) or model.config.hidden_size  # ProphetNet
    hidden = torch.zeros(batch, encoded, width, dtype=keys[0].dtype, device=device)

    def cache(like: list, length: int) -> list[torch.Tensor]:
        return [cache_zeros(t.shape, t.dtype, device, length) for t in like]

    layers = len(keys)
    # Export specializes sizes 0 and 1: the example cache holds 2 entries.
    args = (start, hidden, cache(keys, 2), cache(keys, 2), cache(cross, encoded),
            cache(cross, encoded))
    length = [{2: torch.export.Dim.DYNAMIC}] * layers
    captured = capture_forward(_Step(model), args, dynamic_shapes=(
        None, None, length, length, [None] * layers, [None] * layers))
    # User inputs: token, hidden, the self-attention keys and values, the cross ones.
    name_input_sizes(captured.program, range(2, 2 + 2 * layers), 2, PAST)
    dropped = drop_cache_rebuild(captured.program, range(2, 2 + 4 * layers))
    decode = count_captured(captured, **options)
    # The self-attention cache as in a decoder-only model; the encoder's keys and values,
    # one entry per encoder position and layer, read whole at every step.
    constant = sum(t.numel() * t.dtype.itemsize for t in args[4] + args[5])
    kv = kv_counts(keys + values) + Cost(bytes_read=constant)
    return decode, kv, dropped


def cache_zeros(shape: tuple, dtype: torch.dtype, device, length: int) -> torch.Tensor:
    """Zeros of a cache tensor's layout (batch, kv_heads, length, head_dim) holding ``length``
    entries."""
    return torch.zeros((*shape[:2], length, *shape[3:]), dtype=dtype, device=device)


def kv_counts(tensors: list[torch.Tensor], lengths: list | None = None) -> Cost:
    """Each cache tensor (batch, kv_heads, length, head_dim): the attention reads its cached
    entries and the step's own, the step writes one. ``lengths`` are the cached entries of each,
    ``past`` by default (a sliding-window layer whose window is full holds W - 1)."""
    past = size_symbol(PAST)
    lengths = [past] * len(tensors) if lengths is None else lengths
    rows = [math.prod((*t.shape[:2], *t.shape[3:])) * t.dtype.itemsize for t in tensors]
    return Cost(bytes_read=sum(row * (length + 1) for row, length in zip(rows, lengths)),
                  bytes_written=sum(rows))
