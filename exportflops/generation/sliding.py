"""A decoder-only model's decode step over transformers' ``DynamicCache``, whose layers keep
every entry or, in a sliding window (Mistral, Gemma 2 and 3, Qwen2 with its window...), the
last W - 1.

A sliding layer's attention reads ``min(past, W - 1) + 1`` keys, and one polynomial in ``past``
cannot say that, so a model with sliding layers has its step exported twice by `decode_step`:
with every layer's cache at ``past`` (exact while ``past <= W - 1``: `GenerationReport.decode`)
and with the sliding layers' caches full at W - 1 entries and the others at ``past`` (exact
from ``past >= W - 1``: ``decode_windowed``). `records.generation.request_total` sums each
over its own steps.
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import count_captured
from .cache_names import cache_argument
from ..capture.export import capture_forward
from ..errors import GenerationError
from .seq2seq import cache_zeros, kv_counts
from ..graph.program_edits import drop_cache_rebuild, name_input_sizes
from ..records import Cost, Report
from ..records.generation import PAST
from ..records.symbolic import size_symbol


def cache_windows(model: Any) -> list[int | None]:
    """Each layer's sliding window in the cache transformers builds for the model
    (``DynamicCache(config=...)``), None for a layer that keeps every entry. `GenerationError`
    unless every layer holds keys and values, in full or in one window size: the decode step is
    exported with such a cache and its bytes counted from it."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    name = type(model).__name__
    try:
        cache_layers = DynamicCache(config=model.config).layers
    except Exception as error:  # a config without attention layers (Mamba)
        raise GenerationError(
            f"transformers builds no key/value cache for {name} ({type(error).__name__}: "
            f"{error}); analyze_generation counts attention KV caches. Analyze its forward "
            f"with analyze(model, args) at each length instead.") from error
    other = sorted({type(layer).__name__ for layer in cache_layers}
                   - {DynamicLayer.__name__, DynamicSlidingWindowLayer.__name__})
    if other:
        raise GenerationError(
            f"{name}'s cache has {', '.join(other)} layers (recurrent or indexed state, not "
            f"only keys and values); analyze_generation counts key/value caches of full and "
            f"sliding-window attention. Analyze a decode step with analyze(model, args, "
            f"dynamic_shapes=...) instead.")
    windows = [layer.sliding_window if type(layer) is DynamicSlidingWindowLayer else None
               for layer in cache_layers]
    if len(set(windows) - {None}) > 1:
        raise GenerationError(
            f"{name}'s cache has sliding windows of several sizes {windows}; analyze_generation "
            f"supports one. Analyze a decode step per context length with analyze(model, args) "
            f"instead.")
    return windows


def decode_step(model: Any, input_ids: torch.Tensor, windows: list[int | None],
                tensors: list[torch.Tensor], options: dict) -> tuple[Report, Cost, list[str]]:
    """The decode step, its KV cache bytes and the cache-rebuild nodes left out of it, with
    the layers whose window is given here full (W - 1 entries) and the others at ``past``.
    ``tensors`` are the cache's keys then values, one per layer, at the example length of
    ``past`` (not a window's W - 1: export would take the two for one size)."""
    from transformers import DynamicCache

    layers = len(windows)
    sized = [t if w is None else cache_zeros(t.shape, t.dtype, t.device, w - 1)
             for t, w in zip(tensors, windows * 2)]
    data = [(k, v) if w is None else (k, v, torch.tensor([w]))
            for k, v, w in zip(sized[:layers], sized[layers:], windows)]
    cache_name = cache_argument(model)
    step = {"input_ids": input_ids[:, :1].clone(), "use_cache": True,
            cache_name: DynamicCache(data)}
    # The flattened DynamicCache is [keys per layer, values per layer]; dim 2 is the length.
    spec = [{2: torch.export.Dim.DYNAMIC} if w is None else None for w in windows]
    captured = capture_forward(model, (), step, dynamic_shapes={
        "input_ids": None, cache_name: [spec, spec], "use_cache": None})
    positions = range(1, 1 + 2 * layers)  # user inputs: input_ids, then keys, then values
    name_input_sizes(captured.program, positions, 2, PAST)
    # The exported step starts by rebuilding the DynamicCache from its tensors, copying each
    # (a cat with an empty tensor); a decode loop keeps its cache and does not copy it.
    dropped = drop_cache_rebuild(captured.program, positions)
    lengths = [size_symbol(PAST) if w is None else w - 1 for w in windows * 2]
    return count_captured(captured, **options), kv_counts(sized, lengths), dropped
