"""The checks every batch passes before `FlopsPerBatch` counts it, whichever way it comes in
(its tensors, a padding mask, packed documents, ``seqlens=``, a trainer's hook): a batch the
model cannot run is refused with an `InputError` naming the argument, never counted.

1. Each tensor's kind of dtype (integer, floating, complex) is the example's: float token ids
   fail in the model's embedding, so a count of them is a count of a step that cannot run.
   Integer widths and float precisions may differ (int32 ids, bfloat16 inputs): the FLOPs do
   not change with them.
2. Every size of the batch is at least 1, and every row holds a token: a sequence of zero
   tokens is refused as ``seqlens=[0, ...]`` is.
3. No position past the model's learned position table (`exportflops.generation.limits`): a
   row longer than the table fails its lookup. Packed documents restart their positions, so
   there each document is held against the table; an unpacked row (padding included, whose
   positions run on) by its executed length.

The mask's own values (0 or 1, readable) are checked where they are read
(`exportflops.training.batches`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..generation.limits import decoder_position_limits

#: The kind of a dtype that the example fixes: a batch's tensor may differ in width, not kind.
INTEGER, FLOATING, COMPLEX = "integer", "floating", "complex"


def dtype_kind(tensor: torch.Tensor) -> str:
    """``integer`` (bool included: a mask may be either), ``floating`` or ``complex``."""
    dtype = tensor.dtype
    if dtype.is_complex:
        return COMPLEX
    return FLOATING if dtype.is_floating_point else INTEGER


def dtype_error(where: str, tensor: torch.Tensor, example_kind: str) -> InputError:
    """Item 1 of the module's docstring: ``tensor`` is of another kind than the example's."""
    return InputError(
        f"{where} of the batch is {str(tensor.dtype).removeprefix('torch.')}, a "
        f"{dtype_kind(tensor)} dtype, where the example's was {example_kind}: the model runs "
        f"other code on it (an embedding refuses float ids). Pass {where} as the example had "
        f"it ({'.long()' if example_kind == INTEGER else '.float()'}), or analyze an example "
        f"of these batches.")


def position_limit(model: torch.nn.Module) -> tuple[int, str] | None:
    """The fewest positions any of the model's position tables holds, and what holds them;
    None when nothing bounds them (rotary and relative encodings compute theirs)."""
    limits = decoder_position_limits(model)
    if not limits:
        return None
    tightest = min(limits, key=lambda limit: limit.positions)
    return tightest.positions, tightest.holds()


def check_sizes(sizes: dict[str, int], model: str) -> None:
    """Item 2 of the module's docstring on the sizes, before any value is read."""
    empty = next((name for name, size in sizes.items() if size < 1), None)
    if empty is not None:
        raise InputError(
            f"the batch's {empty} is {sizes[empty]}: a step of no {empty} runs nothing "
            f"{model} would train on (seqlens=[0, ...] is refused for the same reason). Drop "
            f"the empty batch before counting it.")


def check_rows(sizes: dict[str, int], rows: list[list[int]], *, seq: str | None,
               packed: bool, limit: tuple[int, str] | None, model: str) -> None:
    """Items 2 and 3 of the module's docstring on each row's documents."""
    if not all(rows) or min(map(min, rows)) < 1:
        index = next(i for i, row in enumerate(rows) if not row or min(row) < 1)
        raise InputError(f"row {index} of the batch has no tokens ({rows[index]}): drop it "
                         f"from the batch, as seqlens=[0, ...] is refused.")
    if seq is None or limit is None:
        return
    positions, held_by = limit
    longest = max(max(row) for row in rows) if packed else sizes[seq]
    if longest > positions:
        what = (f"a packed document of {longest} tokens" if packed
                else f"rows of {longest} positions (padding included)")
        raise InputError(
            f"{model} cannot run this batch: it holds {what}, and {held_by}. Cut the batch "
            f"to at most {positions} positions per {'document' if packed else 'row'}.")


def values_of(name: str, value: Any) -> Any:
    """``value`` when its values can be read; an `InputError` for a tensor on meta."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        raise InputError(
            f"fpb reads {name}'s values (which positions hold tokens, where documents start), "
            f"and a tensor on the meta device has none. Pass the batch's real {name} (on any "
            f"device), or fpb(seqlens=[...]) with the documents' lengths.")
    return value
