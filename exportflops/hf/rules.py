"""The registry of example inputs: one small rule per input (or per group of inputs made
together) that a forward takes, keyed by the input's name, as `formulas.registry` keys formulas
by op. A rule sees the `Wanted` input and returns its example, or None where the config lacks
the field that sizes it; `make` asks the rules of a name in turn, the first value wins.

Two tiers, asked in this order: `FAMILY`, the inputs of one model family, each sized by the
config field its code reads (``tasks``, ``audio``, ``images``); then `GENERAL`, the inputs every
model of a modality names alike (``modalities``: token ids, images, spectrograms, waveforms).
Within a tier a name's rules run in the order they were registered, which `inputs` fixes by
importing the rule modules in that order. `inputs.example` raises `UnknownInputError` where no
rule makes the input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

#: Tokens per example sequence of a text model, unless seq= says otherwise (or the model's
#: positions are fewer: CLIP's text tower has 77); the length of any input whose length is a
#: free choice (frames, codes, accepted tokens).
HF_DEFAULT_SEQ_LEN = 128
#: The inputs of one model family, each sized by a config field its code reads.
FAMILY = "family"
#: The inputs every model of a modality names alike, made from the name alone.
GENERAL = "general"
TIERS = (FAMILY, GENERAL)


class UnknownInputError(UsageError):
    """forward requires an input that no field of the config shapes."""


class DuplicateRuleError(ValueError):
    """A rule was registered twice for the same input name (a module run twice)."""


@dataclass(frozen=True)
class Wanted:
    """The input a rule is asked for: its ``name``, the model's ``config``, the ``device``
    to make it on, ``batch`` examples and ``seq`` (None: the rule's own default)."""

    name: str
    config: Any
    device: Any
    batch: int
    seq: int | None

    @property
    def steps(self) -> int:
        """The length where it is a free choice: ``seq``, else `HF_DEFAULT_SEQ_LEN`."""
        return self.seq or HF_DEFAULT_SEQ_LEN

    def zeros(self, shape: tuple[int, ...], dtype=None):
        """Zeros of ``shape`` on the wanted device (float32 unless ``dtype``): valid token ids
        and images alike, and the counts depend on shapes only."""
        import torch

        return torch.zeros(shape, dtype=dtype, device=self.device)


Rule = Callable[[Wanted], Any]
#: tier -> input name -> its rules, in the order they are asked.
RULES: dict[str, dict[str, list[Rule]]] = {tier: {} for tier in TIERS}


def input_rule(*names: str, tier: str = FAMILY) -> Callable[[Rule], Rule]:
    """Decorator: ``@input_rule("token_index", "residue_index")`` makes those inputs with the
    decorated rule, asked after the rules registered before it for the same name."""
    if tier not in RULES:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")

    def register(rule: Rule) -> Rule:
        for name in names:
            rules = RULES[tier].setdefault(name, [])
            if any(_qualified(r) == _qualified(rule) for r in rules):
                raise DuplicateRuleError(f"{name!r} already has the rule {_qualified(rule)}; "
                                         f"register each rule once.")
            rules.append(rule)
        return rule

    return register


def make(wanted: Wanted, tiers: tuple[str, ...] = TIERS) -> Any:
    """The first example that a rule of ``tiers`` makes for ``wanted``, None where none does."""
    for tier in tiers:
        for rule in RULES[tier].get(wanted.name, ()):
            value = rule(wanted)
            if value is not None:
                return value
    return None


def _qualified(rule: Rule) -> str:
    return f"{rule.__module__}.{rule.__qualname__}"
