"""Sliding-window layers in a decode step (Mistral, Gemma 2 and 3, Qwen2 with its window...).

transformers' ``DynamicSlidingWindowLayer`` keeps the last W - 1 entries of its layer, so a
decode step's attention there reads ``min(past, W - 1) + 1`` keys. One polynomial in ``past``
cannot say that, so the step is exported twice: with every layer's cache at ``past`` (exact
while ``past <= W - 1``: `GenerationReport.decode`) and with the sliding layers' caches full at
W - 1 entries and the others at ``past`` (exact from ``past >= W - 1``:
``decode_windowed``). `records.generation.request_total` sums each over its own steps.
"""

from __future__ import annotations

from typing import Any

import torch

from .api import count_captured
from .capture import capture_forward
from .errors import GenerationError
from .generation_seq2seq import kv_counts
from .program_edits import drop_cache_rebuild, name_input_sizes
from .records import Counts, Report
from .records.generation import PAST
from .symbolic import size_symbol


def check_key_value_cache(model: Any) -> None:
    """`GenerationError` unless every layer of the cache transformers builds for the model
    (``DynamicCache(config=...)``) holds keys and values, in full or in a sliding window: the
    decode step is exported with such a cache and its bytes counted from it."""
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


def sliding_windows(model: Any, layers: int) -> list[int | None]:
    """Each layer's window, as transformers' ``DynamicCache(config=...)`` builds the model's
    cache (None for a layer that keeps every entry); all None when no layer slides."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache_layers = DynamicCache(config=model.config).layers
    windows = [layer.sliding_window if type(layer) is DynamicSlidingWindowLayer else None
               for layer in cache_layers]
    if not any(windows):
        return [None] * layers
    name = type(model).__name__
    if len(windows) != layers or len(set(windows) - {None}) > 1:
        raise GenerationError(
            f"{name}'s cache has sliding-window layers {windows} that analyze_generation cannot "
            f"pair with its {layers} attention layers' cache (one window size is supported). "
            f"Analyze a decode step per context length with analyze(model, args) instead.")
    return windows


def windowed_step(model: Any, input_ids: torch.Tensor, windows: list[int | None],
                  tensors: list[torch.Tensor], options: dict) -> tuple[Report, Counts]:
    """The decode step once every window is full, and its KV cache bytes. ``tensors`` are the
    cache's keys then values, one per layer, at a length other than W - 1 (the full layers'
    ``past`` at export)."""
    from transformers import DynamicCache

    window = next(w for w in windows if w)
    layers = len(windows)
    sized = [t if w is None else _resized(t, window - 1) for t, w in zip(tensors, windows * 2)]
    keys, values = sized[:layers], sized[layers:]
    data = [(k, v) if w is None else (k, v, torch.tensor([w]))
            for k, v, w in zip(keys, values, windows)]
    step = {"input_ids": input_ids[:, :1].clone(), "use_cache": True,
            "past_key_values": DynamicCache(data)}
    spec = [{2: torch.export.Dim.DYNAMIC} if w is None else None for w in windows]
    captured = capture_forward(model, (), step, dynamic_shapes={
        "input_ids": None, "past_key_values": [spec, spec], "use_cache": None})
    # User inputs: input_ids, then each layer's keys, then its values (the full layers' sized).
    name_input_sizes(captured.program, range(1, 1 + 2 * layers), 2, PAST)
    drop_cache_rebuild(captured.program, range(1, 1 + 2 * layers))
    past = size_symbol(PAST)
    lengths = [past if w is None else window - 1 for w in windows * 2]
    return count_captured(captured, **options), kv_counts(sized, lengths)


def _resized(tensor: torch.Tensor, length: int) -> torch.Tensor:
    shape = (*tensor.shape[:2], length, *tensor.shape[3:])
    return torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
