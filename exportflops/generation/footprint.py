"""generation_memory(): the peak of a prefill step and of a decode step of a transformers
decoder, and the largest batch whose steps fit a device.

Each step is `exportflops.memory`'s forward (under no_grad, the model's own eager code on a
fake copy: nothing is allocated) with transformers' ``DynamicCache`` as ``generate`` passes
it: empty for the prefill; for the decode step, filled on the fake copy with the ``context -
1`` entries per layer the request's last fed token finds (through the cache's own ``update``,
so a sliding-window layer keeps its window). The cache the step starts with counts as an
input; the one it grows into (``torch.cat`` of the entries and the step's own) as a
temporary, and the old one is freed once the cache drops it, as in a real step.

The largest batch: every storage of a step is either the same at every batch (weights, a
batch-free mask) or proportional to it, so each point of a step's timeline is a line in the
batch (`records.generation_memory.PeakLine`):

1. The lines are read from the step run at ``b = max(batch, 2)`` and at ``2 b``, and must
   give the step run at ``3 b`` at every point (else a `ProfileError`): exact where it ran,
   and elsewhere a line checked at one more batch, as `memory`'s symbolic sizes are.
2. They start at batch 2: at batch 1 torch takes other paths (eager GPT-2's attention
   reshapes its transposed keys as a view at batch 1, as a copy from batch 2), as
   ``torch.export`` specializes sizes 0 and 1. The peak of one sequence is the steps' own,
   run at batch 1.
"""

from __future__ import annotations

from typing import Any

import torch

from .cache_names import cache_argument
from .decoder import _cache_tensors, _check, _is_reference_llama, _prefill_logits
from .decoder import dynamic_cache_pytree
from .limits import check_request
from ..count.ranks import fake_copy
from ..errors import GenerationError, InputError, ProfileError
from ..footprint import ALLOCATORS, check_options, default_loss, run_fake
from ..footprint.report import memory_report
from ..records.generation_memory import LINES_FROM_BATCH, GenerationMemory, PeakLine
from ..records.memory import MemoryReport
from ..torch_internals import require


def generation_memory(model: Any, input_ids: torch.Tensor, *, new_tokens: int,
                      allocator: str = "exact") -> GenerationMemory:
    """The memory of generating ``new_tokens`` (>= 2: the last step decodes) after the
    prompts ``input_ids`` (batch x P) with transformers' dynamic cache: the prefill's peak
    (the LM head on the last position, as ``generate`` runs it), the peak of the decode step
    at the request's largest context (P + ``new_tokens`` - 1 positions), and the largest batch
    that fits a device (`GenerationMemory.largest_batch`). ``allocator``: as `memory`'s; under
    ``"cuda"`` the lines hold at the batches run, and elsewhere a point can be off by the
    rounding, under 512 bytes per storage live there (or refused where the check shows it).
    Works on ``meta``. A request the model cannot run is an `InputError` naming the limit."""
    name = type(model).__name__
    batch, prompt_len = _check(model, input_ids, new_tokens, "dynamic", {})
    check_options(name, "forward", "", allocator)
    if _is_reference_llama(model) or getattr(model.config, "is_encoder_decoder", False):
        raise GenerationError(
            f"generation_memory() runs transformers decoder-only models with their "
            f"DynamicCache; {name} is not one. Run exportflops.memory(model, args, "
            f"mode='forward') on its prefill and on a decode step with its cache filled.")
    if new_tokens < 2:
        raise InputError(f"new_tokens=1 for {name}: the prefill makes the only token, and no "
                         f"decode step runs. Pass new_tokens >= 2.")
    check_request(model, prompt_len, new_tokens, None)
    context = prompt_len + new_tokens - 1
    keep = _prefill_logits(model, prompt_len, full_logits=False).keywords
    low = max(batch, LINES_FROM_BATCH)  # step 1 of the module's docstring
    prefills, decodes, cache_bytes = {}, {}, {}
    with dynamic_cache_pytree():  # the cache's layout may come from an exported prefill
        # One fake copy of the model serves every step: a forward under no_grad leaves its
        # parameters and buffers as they were, and the hooks a step puts on it go with it.
        fake_model, _, _ = fake_copy(model, (), {})
        # The decode step's cache layout once, as each tensor's shape after its batch dim
        # (transformers' caches are batch first), from a prefill at batch low (>= 2).
        layout = [(t.shape[1:], t.dtype) for t in _cache_tensors(
            model, torch.zeros(low, 1, dtype=torch.long, device="meta"), context - 1)]
        for b in sorted({1, batch, low, 2 * low, 3 * low}):
            prefills[b], _ = _step(model, fake_model, b, prompt_len, [], keep, allocator)
            decodes[b], cache_bytes[b] = _step(model, fake_model, b, 1, layout, {}, allocator)
    return GenerationMemory(
        model=name, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        context=context, allocator=allocator, kv_cache_bytes=cache_bytes[batch],
        prefill=prefills[batch], decode=decodes[batch],
        one_sequence_peak_bytes=max(prefills[1].peak_bytes, decodes[1].peak_bytes),
        peak_lines=_upper_envelope([*_lines("prefill", prefills, low),
                                    *_lines("decode", decodes, low)]))


def _step(model: Any, fake_model: torch.nn.Module, batch: int, tokens: int,
          layout: list[tuple[tuple, torch.dtype]], keywords: dict,
          allocator: str) -> tuple[MemoryReport, int]:
    """The step of ``tokens`` new tokens per sequence after a cache of ``layout`` (each key
    then each value: its shape after the batch dim, its dtype; [] for none), on ``fake_model``
    (`fake_copy` of ``model``), and the bytes of the cache it starts with."""
    with require("detect_fake_mode")(list(fake_model.parameters())):
        kwargs = {"input_ids": torch.zeros(batch, tokens, dtype=torch.long, device="cpu")}
        cache = _filled_cache(fake_model, batch, layout)
    cache_bytes = sum(t.untyped_storage().nbytes() for layer in cache.layers
                      for t in (layer.keys, layer.values) if t is not None)
    kwargs.update({cache_argument(model): cache, "use_cache": True, **keywords})
    name = type(model).__name__
    run = run_fake(fake_model, (), kwargs, name=name, train=False, optimizer="",
                   optimizer_options=None, loss=default_loss(name))
    return memory_report(run, model, mode="forward", optimizer="", allocator=allocator,
                         size=ALLOCATORS[allocator]), cache_bytes


def _filled_cache(fake_model: torch.nn.Module, batch: int,
                  layout: list[tuple[tuple, torch.dtype]]):
    """transformers' cache of ``fake_model`` filled with zeros of ``layout`` (`_step`'s) for
    ``batch`` sequences, under the fake mode."""
    from transformers import DynamicCache

    cache = DynamicCache(config=fake_model.config)
    keys, values = layout[:len(layout) // 2], layout[len(layout) // 2:]
    for layer, ((key, key_dtype), (value, value_dtype)) in enumerate(zip(keys, values)):
        cache.update(torch.zeros(batch, *key, dtype=key_dtype),
                     torch.zeros(batch, *value, dtype=value_dtype), layer)
    return cache


def _lines(step: str, runs: dict[int, MemoryReport], low: int) -> list[PeakLine]:
    """Each point of ``step`` as a line in the batch, read from its timelines at ``low`` and
    ``2 * low`` and checked at ``3 * low`` (``runs``: the step's report per batch)."""
    once, twice, thrice = runs[low], runs[2 * low], runs[3 * low]
    for other in (2 * low, 3 * low):
        _check_same_ops(step, runs, low, other)
    lines = []
    for a, b in zip(once.timeline, twice.timeline):
        grown = b.live.total - a.live.total
        lines.append(PeakLine(step=step, index=a.index, op=a.op,
                              fixed_bytes=a.live.total - grown,
                              bytes_per_sequence=grown // low))
    # At low the line misses its point where the growth is no whole number per sequence.
    for line, a, c in zip(lines, once.timeline, thrice.timeline):
        if line.at(low) != a.live.total or line.at(3 * low) != c.live.total:
            advice = ("pass allocator='exact' (the CUDA allocator's rounding is not linear in "
                      "the batch)" if once.allocator == "cuda" else
                      "run generation_memory at the batch you mean to run")
            raise ProfileError(
                f"At {a.op} #{a.index} of the {step} step of {once.model}, the live bytes at "
                f"batches {low}, {2 * low} and {3 * low} lie on no line with a whole number "
                f"of bytes per sequence: {advice}.")
    return lines


def _check_same_ops(step: str, runs: dict[int, MemoryReport], batch: int, other: int) -> None:
    """`ProfileError` unless ``step`` runs the same ops at batches ``batch`` and ``other``."""
    ops = [[point.op for point in runs[b].timeline] for b in (batch, other)]
    if ops[0] != ops[1]:
        at = next((i for i, (a, b) in enumerate(zip(*ops)) if a != b), min(map(len, ops)))
        raise ProfileError(
            f"The {step} step of {runs[batch].model} runs other ops at batch {other} than at "
            f"{batch} (from op #{at}), so its memory is no line in the batch: run "
            f"generation_memory at the batch you mean to run.")


def _upper_envelope(lines: list[PeakLine]) -> list[PeakLine]:
    """The lines that are the highest at some batch >= 2, by growing slope (a monotone
    chain: a line is dropped when the one after it overtakes it no later than the one before
    it gave way)."""
    best: dict[int, PeakLine] = {}  # per slope, the highest (the first of equal ones)
    for line in lines:
        kept = best.get(line.bytes_per_sequence)
        if kept is None or line.fixed_bytes > kept.fixed_bytes:
            best[line.bytes_per_sequence] = line
    ordered = sorted(best.values(), key=lambda line: line.bytes_per_sequence)
    hull: list[PeakLine] = []
    for line in ordered:
        while hull and _overtaken(hull[-1], line, hull[-2] if len(hull) > 1 else None):
            hull.pop()
        hull.append(line)
    return hull


def _overtaken(middle: PeakLine, steeper: PeakLine, before: PeakLine | None) -> bool:
    """Whether ``middle`` is nowhere the highest at batch >= 2 between ``before`` and
    ``steeper``: ``steeper`` reaches it at or before 2, or before ``before`` gives way."""
    if steeper.at(LINES_FROM_BATCH) >= middle.at(LINES_FROM_BATCH):
        return True
    if before is None:
        return False
    # before and middle cross at (f_before - f_middle) / (s_middle - s_before), middle and
    # steeper at (f_middle - f_steeper) / (s_steeper - s_middle) (f: fixed bytes, s: bytes
    # per sequence; both denominators positive, so cross-multiplied).
    left = (before.fixed_bytes - middle.fixed_bytes) * (steeper.bytes_per_sequence
                                                         - middle.bytes_per_sequence)
    right = (middle.fixed_bytes - steeper.fixed_bytes) * (middle.bytes_per_sequence
                                                          - before.bytes_per_sequence)
    return right <= left
