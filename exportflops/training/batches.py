"""What a batch says about its rows: padding, and documents packed into one row.

A registry keyed by the forward's argument name, as Hugging Face models name them: each reader
turns that argument's values into each row's documents' lengths. Reading values syncs a CUDA
device (one copy to the host per argument); a batch with none of these arguments is read from
its shapes alone. A value that cannot be read (on meta) or says something impossible (a mask
value of 2, a row of no tokens) is an `InputError` naming the argument.

Flash attention's varlen offsets (``cu_seq_lens_q`` and the rest of `VARLEN_KEYWORDS`) reach a
Hugging Face model through its ``**kwargs``: only a flash-attention kernel reads them (SDPA and
eager attention find the documents from the restarting ``position_ids``), so the analysis is
made without them and they are read here, as the documents of the one packed row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import InputError
from .checks import values_of

#: Argument name -> (the argument's value, the executed batch and sequence sizes) -> each row's
#: documents' lengths, or None when the argument says nothing beyond the shapes.
ROW_READERS: dict[str, Callable[[Any, int, int], list[list[int]] | None]] = {}

#: Keywords of transformers' flash-attention varlen path (``FlashAttentionKwargs``): metadata
#: of the packed row, not inputs of the graph.
VARLEN_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

#: The arguments that mark packed documents, in the order they are looked for.
_PACKING = ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q", "position_ids")


def row_reader(*names: str):
    def register(function):
        for name in names:
            ROW_READERS[name] = function
        return function
    return register


@row_reader("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q")
def cumulative_lengths(value: Any, batch: int, seq: int) -> list[list[int]]:
    """Flash attention's varlen layout: one packed row, documents between the offsets."""
    offsets = values_of("the cumulative sequence lengths", value).reshape(-1).tolist()
    if not offsets or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise InputError(f"cumulative sequence lengths must start at 0 and never decrease, "
                         f"got {offsets[:8]}{'...' if len(offsets) > 8 else ''}")
    if batch != 1 or offsets[-1] != seq:
        raise InputError(
            f"cumulative sequence lengths describe one packed row of {offsets[-1]} tokens, and "
            f"the batch's ids are {batch} x {seq}: pack the documents into one row of that "
            f"many tokens (transformers' DataCollatorWithFlattening does), or pass "
            f"fpb(seqlens=[...]) with their lengths.")
    return [[b - a for a, b in zip(offsets, offsets[1:]) if b > a]]


@row_reader("position_ids")
def restarting_positions(value: Any, batch: int, seq: int) -> list[list[int]] | None:
    """Position ids that restart at 0 inside a row mark packed documents (as transformers'
    ``DataCollatorWithFlattening`` writes them)."""
    if value.dim() != 2:
        return None
    rows = []
    for positions in values_of("position_ids", value).tolist():
        starts = [i for i, p in enumerate(positions) if p == 0] or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        rows.append([b - a for a, b in zip(starts, [*starts[1:], len(positions)])])
    return rows


@row_reader("attention_mask")
def padding_mask(value: Any, batch: int, seq: int) -> list[list[int]] | None:
    """A 2-D mask of 1 (or True) for tokens and 0 for padding: each row at its number of
    tokens. From a device, its per-row sums and its smallest and largest value come to the
    host in one copy."""
    if value.dim() != 2:
        return None  # a 4-D additive mask: the shapes say what runs
    if value.dtype.is_floating_point or value.dtype.is_complex:
        raise InputError(
            f"attention_mask is {str(value.dtype).removeprefix('torch.')}; fpb reads a padding "
            f"mask of 0 and 1 as integers or bools (what tokenizers return): pass "
            f"attention_mask.long().")
    mask = values_of("attention_mask", value)
    tokens = mask.sum(dim=-1)
    if mask.dtype == torch.bool:
        counts, low, high = tokens.tolist(), 0, 1
    elif mask.device.type == "cpu":  # nothing to wait for: three reads beat one stacked copy
        low, high = (int(extreme) for extreme in torch.aminmax(mask))
        counts = tokens.tolist()
    else:  # one copy to the host, one wait for the device
        *counts, low, high = torch.cat((tokens, torch.stack(torch.aminmax(mask)))).tolist()
    if low < 0 or high > 1:
        raise InputError(
            f"attention_mask holds values from {low} to {high}; a padding mask is 1 for a "
            f"token and 0 for padding. Pass the tokenizer's mask (or mask != 0 as integers).")
    if 0 in counts:
        empty = [row for row, count in enumerate(counts) if count == 0]
        raise InputError(
            f"attention_mask marks no token in row(s) {empty[:8]}: a sequence of zero tokens "
            f"is refused as seqlens=[0, ...] is. Drop the empty rows from the batch.")
    return [[count] for count in counts]


def rows_of(arguments: dict[str, Any], batch: int, seq: int) -> list[list[int]]:
    """Each row's documents: packed documents where an argument marks them, each trimmed to
    the row's tokens where a padding mask marks them; else every row whole."""
    packed = None
    for name in _PACKING:
        if arguments.get(name) is not None:
            packed = ROW_READERS[name](arguments[name], batch, seq)
            if packed is not None:
                break
    mask = arguments.get("attention_mask")
    tokens = None if mask is None else ROW_READERS["attention_mask"](mask, batch, seq)
    if tokens is None:
        return packed if packed is not None else [[seq] for _ in range(batch)]
    if packed is None:
        return tokens  # an unpacked row is its tokens, trimmed
    return [_trimmed(row, count) for row, (count,) in zip(packed, tokens)]


def packs_documents(arguments: dict[str, Any]) -> bool:
    """Whether the batch marks packed documents (whose positions restart at each)."""
    return any(arguments.get(name) is not None for name in _PACKING)


def _trimmed(documents: list[int], tokens: int) -> list[int]:
    """A row's documents within its first ``tokens`` positions (padding follows them)."""
    kept, left = [], tokens
    for length in documents:
        if left <= 0:
            break
        kept.append(min(length, left))
        left -= kept[-1]
    return kept


def without_varlen(var_keyword: str | None,
                   arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``arguments`` without the varlen keywords (`VARLEN_KEYWORDS`) that the
    forward's ``**kwargs`` (named ``var_keyword``) took, and those keywords apart."""
    extra = arguments.get(var_keyword) if var_keyword is not None else None
    if not extra:
        return arguments, {}
    varlen = {key: extra[key] for key in VARLEN_KEYWORDS if key in extra}
    if not varlen:
        return arguments, {}
    rest = {key: value for key, value in extra.items() if key not in varlen}
    arguments = {key: value for key, value in arguments.items() if key != var_keyword}
    if rest:
        arguments[var_keyword] = rest
    return arguments, varlen


def var_keyword_of(signature: inspect.Signature) -> str | None:
    """The name of the forward's ``**kwargs``, if it has one."""
    return next((name for name, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD),
                None)


def without_flash_metadata(model: torch.nn.Module, signature: inspect.Signature,
                           kwargs: dict) -> dict:
    """The example's keywords without the varlen ones (``cu_seq_lens_q``, ...) that only a
    flash-attention kernel reads (the module's docstring): the graph is the same without
    them, and each batch's are read for its documents."""
    _, varlen = without_varlen(var_keyword_of(signature),
                               signature.bind_partial(**kwargs).arguments)
    if not varlen:
        return kwargs
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    if "flash" in attention:
        raise InputError(
            f"{type(model).__name__} runs attention with {attention} "
            f"(config._attn_implementation), which reads {', '.join(varlen)} in a CUDA kernel "
            f"that flops_per_batch cannot export here. Analyze the same model with SDPA "
            f"attention (from_pretrained(..., attn_implementation='sdpa')) and the same "
            f"example: each batch's {next(iter(varlen))} still gives its documents, each "
            f"counted as varlen attention runs it, and the count runs on cpu.")
    return {key: value for key, value in kwargs.items() if key not in varlen}
