"""The cost of generating text: the prompt's prefill, one decode step as a function of the
context length, and the whole request. Imports no torch."""

from __future__ import annotations

import math
from typing import Any, Literal

import sympy

from .symbolic import Evaluator, size_symbol
from .base import SCHEMA_VERSION, Cost, NotebookRecord
from ..errors import InputError
from .report import Report

#: The dynamic size of a decode step: tokens already in the KV cache.
PAST = "past"


class GenerationReport(NotebookRecord):
    """One generation request: ``batch`` prompts of ``prompt_len`` tokens, ``new_tokens`` tokens
    generated per prompt with a KV cache.

    The first new token comes out of the prefill; each later one out of a decode step that
    processes one token per sequence with ``past`` tokens already cached, so the request runs
    the decode step at ``past = prompt_len .. prompt_len + new_tokens - 2`` (an encoder-decoder
    model at ``past = 1 .. new_tokens - 1``: its decoder's cache holds its own tokens).
    """

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The analyzed model's class."""
    batch: int
    """Sequences per request."""
    prompt_len: int
    """Tokens per prompt (P); for an encoder that reads input features (Whisper), the
    encoder's positions (the length its cross-attention reads)."""
    new_tokens: int
    """Tokens generated per sequence (G), the first by the prefill."""
    cache: Literal["dynamic", "static"]
    """``dynamic``: the cache grows by one entry per step and attention reads ``past + 1``
    keys; ``static``: a buffer of ``max_cache_len`` entries, attended in full at every step."""
    first_past: int | None = None
    """``past`` of the first decode step when it is not ``prompt_len``: 1 for an
    encoder-decoder model, whose prefill runs the encoder over the prompts and the decoder over
    its start token, so the decoder's self-attention cache starts with one entry."""
    max_cache_len: int | None = None
    """Entries of the static cache (None for a dynamic cache)."""
    work: Literal["useful", "executed"]
    """``useful`` (dynamic cache): attention over the keys that exist; ``executed`` (static
    cache): the work as it runs, attention over the whole padded cache, masked entries
    included."""
    prefill_logit_positions: int
    """Positions per sequence whose logits the prefill computes (the rows the LM head runs
    on). 1 where transformers' ``generate`` keeps only the last position's: a model whose
    forward takes ``logits_to_keep`` (``generate`` passes 1), the built-in Llama built with
    ``logits_last_only``, an encoder-decoder model (its decoder reads one start token).
    ``prompt_len`` for a model that computes every position's logits (its forward takes no
    ``logits_to_keep``; the built-in Llama as Meta's reference runs it) or when analyzed with
    ``full_logits=True``."""
    prefill: Report
    """The forward over the prompts that fills the cache; its LM head runs on
    ``prefill_logit_positions`` positions per sequence."""
    decode: Report
    """One decode step. For a dynamic cache its counts are polynomials in the size ``past``;
    for a static cache they are constants (the step is the same at every position). What a
    decode loop executes: the exported step's rebuild of the cache is left out
    (``dropped_nodes``)."""
    kv_cache: Cost
    """The part of one decode step's bytes that is the KV cache: ``bytes_read`` the entries the
    attention reads (``past + 1`` per layer for a dynamic cache, ``max_cache_len`` for a static
    one), ``bytes_written`` the step's new entry per layer; from the cache's own tensors (key
    and value heads, not query heads). Included in ``decode.total``."""
    dropped_nodes: list[str] = []
    """Nodes of the exported decode step left out of ``decode``: at the step's start
    transformers rebuilds a dynamic cache from its input tensors, copying each (a ``cat`` with
    an empty tensor), one read and one write of the whole past cache that a decode loop, which
    keeps its cache between steps, does not make."""
    total: Cost
    """The whole request: the prefill plus every decode step, summed in closed form."""
    sliding_window: int | None = None
    """The window W of the model's sliding-window layers (transformers'
    ``DynamicSlidingWindowLayer``), None when no layer slides. Such a layer keeps the last
    W - 1 entries: once ``past >= W - 1`` its attention reads W keys, not ``past + 1``, so
    ``decode`` holds for ``past <= W - 1`` and ``decode_windowed`` from there on."""
    decode_windowed: Report | None = None
    """The decode step once the sliding windows are full (``past >= sliding_window - 1``):
    the sliding layers' caches at W - 1 entries, the others' at ``past``."""
    kv_cache_windowed: Cost | None = None
    """`kv_cache` of ``decode_windowed``."""

    def step(self, past: int) -> Report:
        """The decode step with ``past`` tokens in the cache, as a concrete `Report`."""
        decode = self._decode_at(past)
        if PAST not in {symbol.name for symbol in decode.symbols}:
            _check_position(self, past)  # the same step at every position
            return decode
        return decode.evaluate(**{PAST: past})

    def step_counts(self, past: int) -> Cost:
        """The decode step's model total with ``past`` tokens in the cache."""
        return _at(self._decode_at(past).total, past)

    def kv_cache_at(self, past: int) -> Cost:
        """`kv_cache` with ``past`` tokens in the cache."""
        return _at(self.kv_cache_windowed if self.windows_full(past) else self.kv_cache, past)

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """Bytes one token adds to one sequence's KV cache, over all layers: what a decode
        step writes (`kv_cache` ``bytes_written``, one entry per layer) per sequence."""
        return int(self.kv_cache.bytes_written) // self.batch

    def kv_cache_bytes(self, context: int) -> int:
        """Bytes the KV cache holds for the request's ``batch`` sequences while the decode
        step that brings each to ``context`` tokens attends: what that step reads of the cache
        (`kv_cache_at` ``context - 1``, ``bytes_read``), so every layer's ``context`` entries,
        a sliding layer's at most its window's (the W - 1 it keeps and the new one), an
        encoder-decoder's cross-attention cache, a static cache's whole buffer whatever
        ``context``."""
        if not 1 <= context <= (self.max_cache_len or context):
            raise InputError(f"context={context} for the KV cache of {self.model}: it holds "
                             f"1 .. {self.max_cache_len or 'any number of'} tokens per "
                             f"sequence.")
        return int(self.kv_cache_at(context - 1).bytes_read)

    def largest_batch(self, budget_bytes: int, context: int) -> int:
        """The most sequences whose KV caches at ``context`` tokens fit ``budget_bytes`` (a
        cache is the same per sequence: `kv_cache_bytes` / ``batch`` each). The budget is the
        cache's own: the weights and a step's activations come out of the same memory
        (`exportflops.memory`), so subtract them first."""
        return budget_bytes * self.batch // self.kv_cache_bytes(context)

    def windows_full(self, past: int) -> bool:
        """Whether the sliding windows are full at a step with ``past`` tokens seen (the step
        is ``decode_windowed``); False for a model without sliding windows."""
        return self.decode_windowed is not None and past >= self.sliding_window - 1

    def _decode_at(self, past: int) -> Report:
        return self.decode_windowed if self.windows_full(past) else self.decode

    @property
    def decode_positions(self) -> range:
        """The ``past`` of every decode step the request runs."""
        first = self.prompt_len if self.first_past is None else self.first_past
        return range(first, first + self.new_tokens - 1)

    def to_pandas(self) -> Any:
        """One row for the prefill and one per decode step, counts evaluated at the step's
        ``past``, as a pandas DataFrame, the columns of `to_csv` (needs ``pip install
        'exportflops[pandas]'``): the rows' counts sum to `total`."""
        from ..render.tables import to_pandas

        return to_pandas(self, "steps")

    def _repr_html_(self) -> str:
        """What Jupyter shows: the per-token table, and the prefill's and decode step's
        reports, collapsible (plain HTML, no script)."""
        from ..render.notebook import generation_html

        return generation_html(self)


def request_total(prefill: Cost, step: Cost, first: int, new_tokens: int, *,
                  windowed: Cost | None = None, window: int | None = None) -> Cost:
    """The prefill plus the decode step summed over ``past = first .. first + G - 2`` (``first``
    = P for a decoder-only model) in closed form:
    each count is a polynomial in ``past`` (a constant for a static cache), summed in closed
    form (`power_sum`), never by evaluating the steps one by one. With sliding windows of
    ``window`` entries, ``step`` is summed up to ``past = window - 2`` and ``windowed`` from
    ``window - 1``."""
    past = size_symbol(PAST)
    last = first + new_tokens - 2  # below first for one new token: no decode step runs
    spans = [(step, first, last)] if windowed is None else [
        (step, first, min(last, window - 2)), (windowed, max(first, window - 1), last)]

    def summed(name: str) -> int:
        return sum(power_sum(sympy.sympify(getattr(counts, name)), past, start, end)
                   for counts, start, end in spans if start <= end)

    return Cost(**{name: getattr(prefill, name) + summed(name)
                     for name in Cost.model_fields})


def power_sum(polynomial: sympy.Expr, symbol: sympy.Symbol, first: int,
              last: int) -> int | sympy.Expr:
    """``sum(polynomial at symbol = first .. last)`` in closed form, by Newton's forward-difference
    formula: a polynomial of degree d summed over n consecutive integers is
    ``sum_k (d^k p)(first) * C(n, k + 1)``, from its values at first .. first + d. Exact in
    integers, and a few evaluations whatever n is (sympy's summation takes milliseconds a
    count)."""
    if symbol not in polynomial.free_symbols:
        return _number(polynomial * (last - first + 1))
    degree = sympy.Poly(polynomial, symbol).degree()
    differences = [polynomial.subs(symbol, first + i) for i in range(degree + 1)]
    total = 0
    for k in range(degree + 1):
        total += differences[0] * math.comb(last - first + 1, k + 1)
        differences = [b - a for a, b in zip(differences, differences[1:])]
    return _number(total)


def _number(value: sympy.Expr) -> int | sympy.Expr:
    """An int when ``value`` is one; else the expanded expression: a count that also depends on
    a data-dependent size (an MoE's tokens per expert, ``u0``...), the same at every step."""
    value = sympy.expand(value)
    return int(value) if value.is_number else value


def _at(counts: Cost, past: int) -> Cost:
    return counts.evaluated(Evaluator({PAST: past}))


def _check_position(report: GenerationReport, past: int) -> None:
    if report.max_cache_len is not None and not 0 <= past < report.max_cache_len:
        raise ValueError(f"past={past} does not fit the static cache of {report.model}: its "
                         f"positions are 0 .. {report.max_cache_len - 1}; analyze with a larger "
                         f"max_cache_len.")
