"""The positions a generation request needs, against those the model holds: a request the model
cannot run is refused with an `InputError` that names the limit, never counted.

A decoder-only request of P prompt tokens and G new tokens feeds tokens at positions
0 .. P + G - 2 (the last new token comes out of the step at ``past = P + G - 2`` and is never fed
back), so it needs P + G - 1 positions. An encoder-decoder model's encoder reads positions
0 .. P - 1 and its decoder 0 .. G - 1 (its start token, then G - 1 steps).

The limits, where they exist:

1. A learned position table: an ``nn.Embedding`` looked up by position, whose rows are the
   config's position count (``max_position_embeddings``, which GPT-2's config maps to
   ``n_positions``; Whisper's ``max_source_positions`` and ``max_target_positions``), less the
   ``offset`` by which OPT and BART shift their positions (their table has 2 rows more). Past
   its last row the lookup fails (an IndexError on cpu, a device-side assert on cuda); on meta
   nothing checks, so without this a count would come back for a run that cannot happen.
2. The built-in Llama's ``max_seq_len``: Meta's reference holds its cache in buffers of that
   many entries.
3. A static cache's ``max_cache_len`` entries.

`check_options` checks the request's arguments alone (the command runs it before building the
model), `check_request` them against the model.

A rotary, relative or ALiBi position encoding computes its positions and runs past the config's
``max_position_embeddings`` (the length it was trained to, not one it is bound to): not refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError

#: The config attributes that count the rows of a learned position table (`_position_counts`).
_POSITION_COUNTS = ("max_position_embeddings", "max_source_positions", "max_target_positions")


@dataclass(frozen=True)
class _Limit:
    """At most ``positions`` positions (0 .. positions - 1), held by ``source``; ``reason``
    says what happens past them."""

    positions: int
    source: str
    reason: str

    def holds(self) -> str:
        return f"{self.source} holds positions 0 .. {self.positions - 1} ({self.reason})"


def check_options(new_tokens: Any, cache: Any, max_cache_len: Any) -> None:
    """`InputError` unless ``new_tokens`` is a count >= 1, ``cache`` ``"dynamic"`` or
    ``"static"``, and ``max_cache_len`` None or (with ``cache="static"``) a count >= 1."""
    if cache not in ("dynamic", "static"):
        raise InputError(f"cache={cache!r}: analyze_generation counts a cache that grows "
                         f"('dynamic') or a static one of max_cache_len entries ('static'); "
                         f"pass one of them.")
    if not _is_count(new_tokens):
        raise InputError(f"new_tokens={new_tokens!r}: a request generates a count of new tokens "
                         f">= 1 after the prompt; pass new_tokens=N with N >= 1.")
    if max_cache_len is None:
        return
    if cache == "dynamic":
        raise InputError(f"max_cache_len= sizes a static cache: it needs cache='static'; pass "
                         f"new_tokens={new_tokens} cache='static' max_cache_len={max_cache_len}.")
    if not _is_count(max_cache_len):
        raise InputError(f"max_cache_len={max_cache_len!r}: a static cache holds a count of "
                         f"entries >= 1; pass max_cache_len=N with N >= 1, or leave it out for "
                         f"the default, prompt + new tokens.")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_request(model: Any, prompt_len: int, new_tokens: int,
                  max_cache_len: int | None) -> None:
    """`InputError` unless the model can run P = ``prompt_len`` prompt tokens and G =
    ``new_tokens`` new tokens (with a static cache of ``max_cache_len`` entries, if given)."""
    name = type(model).__name__
    if max_cache_len is not None and max_cache_len < prompt_len + new_tokens - 1:
        raise InputError(
            f"max_cache_len={max_cache_len} cannot hold the request to {name}: the prompt "
            f"({prompt_len} tokens) and the new tokens but the last ({new_tokens - 1}) need "
            f"{prompt_len + new_tokens - 1} entries of the static cache. Pass max_cache_len >= "
            f"{prompt_len + new_tokens - 1} (--max-cache-len), or leave it out for the default, "
            f"prompt + new tokens.")
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        for limit in _learned_tables(model, config, model.get_encoder()):
            _refuse_prompt(name, prompt_len, limit)
        for limit in _learned_tables(model, config, model.get_decoder()):
            if new_tokens > limit.positions:
                raise InputError(
                    f"{name} cannot generate {new_tokens} tokens: its decoder puts them at "
                    f"positions 0 .. {new_tokens - 1} (the start token, then a step per token "
                    f"but the last), and {limit.holds()}. Generate at most "
                    f"{limit.positions} new tokens.")
        return
    for limit in decoder_position_limits(model):
        _refuse_prompt(name, prompt_len, limit)
        needed = prompt_len + new_tokens - 1
        if needed > limit.positions:
            raise InputError(
                f"{name} cannot run this request: {prompt_len} prompt tokens and {new_tokens} "
                f"new tokens feed tokens at positions 0 .. {needed - 1} (the last new token is "
                f"never fed back), and {limit.holds()}. Generate at most "
                f"{limit.positions - prompt_len + 1} new tokens after this prompt (prompt + new "
                f"tokens - 1 <= {limit.positions}), or shorten the prompt.")


def _refuse_prompt(name: str, prompt_len: int, limit: _Limit) -> None:
    if prompt_len > limit.positions:
        raise InputError(
            f"{name} cannot read a prompt of {prompt_len} tokens: they take positions 0 .. "
            f"{prompt_len - 1}, and {limit.holds()}. Shorten the prompt to at most "
            f"{limit.positions} tokens.")


def decoder_position_limits(model: Any) -> list[_Limit]:
    """The limits of a decoder-only model's positions (items 1 and 2 of the module's docstring)."""
    from ..examples.llama import Llama

    if isinstance(model, Llama):
        return [_Limit(model.config.max_seq_len,
                       f"the config's max_seq_len = {model.config.max_seq_len}",
                       "Meta's reference keeps its KV cache in buffers of that many entries")]
    config = getattr(model, "config", None)
    return [] if config is None else _learned_tables(model, config, model)


def _learned_tables(model: torch.nn.Module, config: Any,
                    part: torch.nn.Module) -> list[_Limit]:
    """The learned position tables of ``model`` in ``part`` (itself, or its encoder or decoder;
    item 1 of the module's docstring): an embedding whose rows, less its ``offset``, are one of
    the config's position counts. The token embedding is told apart by its rows, the
    vocabulary's. Paths are the model's."""
    counts = _position_counts(config)
    vocab = getattr(_text_config(config), "vocab_size", None)
    inside = {id(module) for module in part.modules()}
    limits = []
    for path, table in model.named_modules():
        if not isinstance(table, torch.nn.Embedding) or table.num_embeddings == vocab \
                or id(table) not in inside:
            continue
        offset = getattr(table, "offset", 0)
        attribute = counts.get(table.num_embeddings - offset)
        if attribute is not None:
            shifted = f", less the offset {offset} its positions are shifted by" if offset else ""
            limits.append(_Limit(
                table.num_embeddings - offset,
                f"the learned position table {path} (an nn.Embedding of "
                f"{table.num_embeddings} rows{shifted}: config.{attribute} = "
                f"{table.num_embeddings - offset})",
                "past them its lookup fails: an IndexError on cpu"))
    return limits


def _position_counts(config: Any) -> dict[int, str]:
    """Each position count the config declares -> the attribute that holds it, by its own name
    (GPT-2's ``n_positions``, which transformers' ``attribute_map`` reads as
    ``max_position_embeddings``)."""
    text = _text_config(config)
    aliases = getattr(text, "attribute_map", {})
    counts = {}
    # nanoGPT's GPTConfig sizes its position table wpe by block_size (model.py asserts
    # t <= block_size); a transformers config's block_size is something else (BigBird's
    # attention blocks), so it is read only outside transformers.
    named = _POSITION_COUNTS + (() if hasattr(config, "get_text_config") else ("block_size",))
    for attribute in named:
        value = getattr(text, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            counts.setdefault(value, aliases.get(attribute, attribute))
    return counts


def _text_config(config: Any) -> Any:
    """A transformers config's text part; any other config (nanoGPT's ``GPTConfig``) as it is."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config
