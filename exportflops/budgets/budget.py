"""What a budget is: the components a source derives by hand, each with its formula, and the
graph roles a comparison maps onto each component.

Roles name the parts of a transformer's graph a component covers (`compare.ROLES`): ``qkv``,
``attention_out``, ``scores`` (q . k), ``reduce`` (p . v), ``attention_rest`` (scale, mask,
softmax), ``ffn_up``, ``ffn_gate``, ``ffn_down``, ``head``, ``embedding``, ``norm``, ``biases``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ..records import Record
from .config import AttentionPairs, TransformerConfig

ItemKind = Literal["matmul", "other", "subtotal"]

#: What each convention of `TransformerConfig.attention_pairs` counts, phrased as the reason a
#: count in the other convention differs.
PAIRS_CONVENTION: dict[AttentionPairs, str] = {
    "square": "attention over the full T x T square: the pairs a causal mask discards are "
              "computed too (nanoGPT, PaLM, torchtitan, and an SDPA call)",
    "causal": "attention over the T(T+1)/2 (query, key) pairs a causal mask keeps "
              "(Megatron-LM, MaxText, flash-attention's benchmarks)",
}


class BudgetItem(Record):
    """One component of a budget: FLOPs of the whole budgeted call (every layer, the batch)."""

    name: str
    """The source's name for it, e.g. ``attention/kqv``."""
    kind: ItemKind
    """``matmul`` (2 FLOPs per multiply-accumulate), ``other`` (a non-matmul term, such as
    Chinchilla's softmax) or ``subtotal`` (the sum of ``parts``)."""
    each: int
    """FLOPs of one occurrence, as the source prints it (one block for per-block items)."""
    repeats: int
    """Occurrences: L for a per-block item, 1 otherwise."""
    formula: str
    """``each`` in the config's symbols (config.py), e.g. ``2 B T d (H + 2 KV) hd``."""
    roles: list[str] = []
    """The graph roles this component covers (empty for subtotals)."""
    parts: list[str] = []
    """For a subtotal: the names of the items it sums."""
    unit: str = ""
    """What ``units`` counts, e.g. ``token`` or ``score``: a difference is reported per unit."""
    units: int = 0
    """How many units the whole item covers (0 when per-unit reporting does not apply)."""
    alternatives: dict[str, int] = {}
    """The same component in another convention: description -> FLOPs of the whole item. A
    comparison names the alternative the graph matches exactly."""
    note: str = ""
    """How the source counts this component, where that differs from the graph's convention."""

    @property
    def flops(self) -> int:
        """``each * repeats``: the whole budgeted call."""
        return self.each * self.repeats


class Budget(Record):
    """A hand-derived FLOP budget of one `TransformerConfig`, from one published source."""

    source: str
    """Who derived it and where, e.g. ``Karpathy, nanoGPT transformer_sizing.ipynb``."""
    url: str
    """Where to read the derivation."""
    scope: str
    """What the budget counts and leaves out."""
    config: TransformerConfig
    """The transformer and call budgeted."""
    items: list[BudgetItem]
    """Components, subtotals after their parts, in the source's order."""
    total: str
    """Name of the item that is the forward total; items outside it are compared too."""

    @model_validator(mode="after")
    def _check(self) -> Budget:
        by_name = {item.name: item for item in self.items}
        if len(by_name) != len(self.items):
            raise ValueError(f"{self.source}: item names repeat")
        if self.total not in by_name:
            raise ValueError(f"{self.source}: no item {self.total!r} to be the forward total")
        claimed: dict[str, str] = {}
        for item in self.items:
            for role in item.roles:
                if role in claimed:
                    raise ValueError(f"{self.source}: role {role!r} is in both "
                                     f"{claimed[role]!r} and {item.name!r}")
                claimed[role] = item.name
            if item.kind == "subtotal":
                missing = [p for p in item.parts if p not in by_name]
                if missing or not item.parts:
                    raise ValueError(f"{self.source}: subtotal {item.name!r} sums unknown "
                                     f"items {missing}")
                parts_flops = sum(by_name[p].flops for p in item.parts)
                if parts_flops != item.flops:
                    raise ValueError(f"{self.source}: subtotal {item.name!r} is {item.flops:,}, "
                                     f"its parts sum to {parts_flops:,}")
        return self

    def item(self, name: str) -> BudgetItem:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(f"no item {name!r} in the {self.source} budget; items: "
                       f"{[i.name for i in self.items]}")

    def leaves(self, name: str | None = None) -> list[BudgetItem]:
        """The non-subtotal items under ``name`` (the forward total by default)."""
        item = self.item(self.total if name is None else name)
        if item.kind != "subtotal":
            return [item]
        return [leaf for part in item.parts for leaf in self.leaves(part)]

    @property
    def forward(self) -> int:
        """Forward FLOPs of the budgeted call."""
        return self.item(self.total).flops

    @property
    def backward(self) -> int:
        """2 x forward: the estimate every source here uses (Kaplan et al. 2020, section 2.1)."""
        return 2 * self.forward

    @property
    def training(self) -> int:
        """forward + backward = 3 x forward."""
        return self.forward + self.backward


def subtotal(name: str, parts: list[BudgetItem], *, repeats: int = 1,
             formula: str = "") -> BudgetItem:
    """The sum of ``parts``, ``repeats`` times per call (``each`` = one occurrence)."""
    total = sum(p.flops for p in parts)
    if total % repeats:
        raise ValueError(f"subtotal {name!r}: {total:,} is not {repeats} equal occurrences")
    return BudgetItem(name=name, kind="subtotal", each=total // repeats, repeats=repeats,
                      formula=formula or " + ".join(p.name for p in parts),
                      parts=[p.name for p in parts])


def pairs_formula(config: TransformerConfig) -> str:
    """`TransformerConfig.pairs_per_layer` in the formulas' symbols."""
    return "B H T T" if config.attention_pairs == "square" else "B H T(T+1)/2"


def pairs_alternative(config: TransformerConfig, flops_per_pair: int) -> dict[str, int]:
    """A per-pair item in the other `attention_pairs` convention: description -> FLOPs of every
    layer."""
    other: AttentionPairs = "causal" if config.attention_pairs == "square" else "square"
    return {PAIRS_CONVENTION[other]:
            config.layers * flops_per_pair * config.pairs_per_layer(other)}


def head_alternatives(config: TransformerConfig) -> dict[str, int]:
    """The LM head's matmul in the other placement: every position, or the last one only."""
    c = config
    if c.head_positions == "all":
        return {"the LM head on the last position only (generation)":
                2 * c.batch * c.width * c.vocab}
    return {"the LM head on all T positions": 2 * c.tokens * c.width * c.vocab}
