"""The stack -> formula registry: one small decorated function per stack, each with the file,
function and commit of the published code it transcribes.

A formula sees `ModelFacts` (the model's Hugging Face config, its parameter groups, the batch's
rows and lengths) and returns its FLOPs per step split into `parts.PARTS`; the parts sum to
what the stack would log. A model its source does not handle raises `NotCovered` with the
source's own behaviour (verl logs 0 for a model type it lacks, TRL raises on a config field it
reads): the comparison says so instead of inventing a number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .parts import PARTS, ParamGroups

#: Which tokens a stack divides by, and multiplies its per-token formula by: every position of
#: the batch (``padded``: B x T) or the positions an attention mask keeps (``real``).
TokenCount = Literal["padded", "real"]


class NotCovered(Exception):
    """The stack's published formula does not handle this model; the message says what the
    stack itself does (logs 0, raises) and why."""


@dataclass(frozen=True)
class ModelFacts:
    """What the stacks' formulas read."""

    config: Any
    """The model's Hugging Face config (``model.config``)."""
    params: ParamGroups
    """Its parameters by group, from the report's modules."""
    rows: int
    """Rows of the batch, B."""
    seq: int
    """Positions per row, T (padding included)."""
    lengths: tuple[int, ...]
    """Each row's tokens without padding (T each for a batch without a mask)."""
    model: Any = None
    """The model, when `conventions` was given it (``config=model``): what a stack that
    counts a run (DeepSpeed's profiler) runs, on fake tensors; None with a bare config."""
    forward_kwargs: Any = None
    """The batch as the forward's keyword arguments, for that run."""

    @property
    def padded_tokens(self) -> int:
        """B x T."""
        return self.rows * self.seq

    @property
    def real_tokens(self) -> int:
        """Tokens that are not padding."""
        return sum(self.lengths)

    def field(self, name: str, stack: str, function: str) -> Any:
        """``config.name``, or `NotCovered` saying the stack's code raises reading it."""
        if not hasattr(self.config, name):
            raise NotCovered(f"{stack}'s {function} reads config.{name}, which "
                             f"{type(self.config).__name__} lacks: it raises AttributeError")
        return getattr(self.config, name)


Formula = Callable[[ModelFacts], dict[str, int]]


@dataclass(frozen=True)
class StackFormula:
    """One stack's convention."""

    name: str
    """The stack, e.g. ``torchtitan``."""
    repository: str
    """Where the formula is published: ``owner/name@commit``, a release, or a paper."""
    source: str
    """File and function (or section) of the formula transcribed."""
    tokens: TokenCount
    """The tokens its per-token figure divides by."""
    formula: Formula
    forward_multiple: bool = False
    """The stack counts a forward and takes the step as a multiple of it (DeepSpeed): its
    parts are forward FLOPs and one ``backward`` part, compared with the graph's forward by
    part and its backward whole."""

    def parts(self, facts: ModelFacts) -> dict[str, int]:
        """FLOPs per step by part; `NotCovered` where the source does not handle the model."""
        parts = self.formula(facts)
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"{self.name}: formula returned unknown parts {sorted(unknown)}")
        return parts

    def tokens_of(self, facts: ModelFacts) -> int:
        return facts.padded_tokens if self.tokens == "padded" else facts.real_tokens


STACKS: dict[str, StackFormula] = {}


def stack(name: str, *, repository: str, source: str, tokens: TokenCount,
          forward_multiple: bool = False) -> Callable[[Formula], Formula]:
    """Decorator: register the formula of stack ``name``; a second formula of one name is an
    error, not a silent replacement."""

    def decorate(formula: Formula) -> Formula:
        if name in STACKS:
            raise ValueError(f"stack {name!r} is registered twice")
        STACKS[name] = StackFormula(name, repository, source, tokens, formula,
                                    forward_multiple)
        return formula

    return decorate
