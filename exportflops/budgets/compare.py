"""``compare(report, budget)``: a hand-derived budget beside the exported graph, component by
component, with the reason for each difference.

How the graph's work reaches a budget component:

1. Every forward node of the report gets a role from the first `MappingRule` whose patterns
   match its module path and op (``fnmatch``); a node no rule matches is ``other``.
   `DEFAULT_MAPPING` names the modules of nanoGPT, Hugging Face GPT-2, Llama, Mistral and Qwen2,
   and Meta's Llama reference (`exportflops.examples`).
2. A node's matmul FLOPs (2 per MAC) go to its role and the rest to the role's elementwise part:
   a projection's bias adds to ``biases``; an attention call (role ``attention``) splits its
   matmul into ``scores`` (q . k) and ``reduce`` (p . v) by the head dims of q and v, and its
   scale, mask and softmax go to ``attention_rest``.
3. A budget component counts the roles it lists (`BudgetItem.roles`); a role no component lists
   is a row of its own: work outside the budget, with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from ..records import FLOPS_PER_MAC, NodeRecord, Record, Report
from .budget import Budget, BudgetItem
from .config import TransformerConfig

RuleRole = Literal["qkv", "attention_out", "attention", "scores", "reduce", "attention_rest",
                   "ffn_up", "ffn_gate", "ffn_down", "head", "embedding", "norm", "activation",
                   "positions", "mask", "residual", "other"]

#: Every role a FLOP can end in, in table order, with what it is.
ROLES: dict[str, str] = {
    "embedding": "embedding lookups",
    "qkv": "query, key and value projections",
    "scores": "attention scores q . k",
    "reduce": "attention-weighted sums of the values p . v",
    "attention_rest": "scale, mask and softmax of every attention score (inside the SDPA call)",
    "attention_out": "attention output projections",
    "ffn_up": "FFN up projections",
    "ffn_gate": "FFN gate projections",
    "ffn_down": "FFN down projections",
    "head": "LM head",
    "norm": "norms: statistics, scale and shift per element",
    "activation": "FFN activations and the gated FFN's elementwise product",
    "biases": "bias adds of the projections, 1 FLOP per output element",
    "positions": "position embeddings: rotary tables and rotations, or the add of a learned table",
    "mask": "the attention mask and position ids, built from the positions by compares",
    "residual": "residual adds",
    "other": "ops no mapping rule names",
}

#: Roles whose nodes are contractions: their matmul FLOPs stay, their bias adds go to ``biases``.
MATMUL_ROLES = frozenset({"qkv", "attention_out", "scores", "reduce", "ffn_up", "ffn_gate",
                          "ffn_down", "head"})

RowKind = Literal["matmul", "other", "subtotal", "outside", "total"]


class MappingRule(Record):
    """Graph nodes whose module path and op match the patterns play ``role``."""

    module: str
    """``fnmatch`` pattern on the node's module path (``named_modules()`` names, ``""`` the
    root), e.g. ``*.attn.c_attn``; ``*`` also crosses dots."""
    op: str = "*"
    """``fnmatch`` pattern on the node's op, e.g. ``aten.add*``."""
    role: RuleRole
    """The part of the transformer the nodes compute; ``attention`` splits into ``scores``,
    ``reduce`` and ``attention_rest`` (see the module docstring)."""

    def matches(self, node: NodeRecord) -> bool:
        return fnmatchcase(node.module, self.module) and fnmatchcase(node.op, self.op)


def _rules(role: RuleRole, *modules: str, op: str = "*") -> list[MappingRule]:
    return [MappingRule(module=module, op=op, role=role) for module in modules]


#: First match wins, so the specific rules come first: attention kernels and lookups anywhere,
#: then norms, then each family's projections, then what else runs in attention, FFN and block.
DEFAULT_MAPPING: list[MappingRule] = [
    *_rules("attention", "*", op="aten.*scaled_dot_product*"),
    *_rules("attention", "*", op="aten._*_attention_forward*"),
    *_rules("embedding", "*", op="aten.embedding*"),
    *_rules("norm", "*", op="aten.*layer_norm*"),
    *_rules("norm", "*", op="aten.*rms_norm*"),
    *_rules("norm", "*norm", "*.ln_*"),  # norms written out (HF's LlamaRMSNorm), GPT-2's ln_1
    # nanoGPT and Hugging Face GPT-2
    *_rules("qkv", "*.attn.c_attn"),
    *_rules("attention_out", "*.attn.c_proj"),
    *_rules("ffn_up", "*.mlp.c_fc"),
    *_rules("ffn_down", "*.mlp.c_proj"),
    *_rules("positions", "", "transformer", op="aten.add*"),  # token + learned position rows
    # Meta's Llama reference (llama/model.py)
    *_rules("qkv", "*.attention.w[qkv]"),
    *_rules("attention_out", "*.attention.wo"),
    *_rules("ffn_gate", "*.feed_forward.w1"),
    *_rules("ffn_up", "*.feed_forward.w3"),
    *_rules("ffn_down", "*.feed_forward.w2"),
    # Hugging Face Llama, Mistral, Qwen2
    *_rules("qkv", "*.self_attn.[qkv]_proj"),
    *_rules("attention_out", "*.self_attn.o_proj"),
    *_rules("ffn_gate", "*.mlp.gate_proj"),
    *_rules("ffn_up", "*.mlp.up_proj"),
    *_rules("ffn_down", "*.mlp.down_proj"),
    *_rules("head", "lm_head", "output"),
    # The rest of attention is the rotary rotation of queries and keys; of an FFN, activations.
    *_rules("positions", "rope", "*rotary_emb", "*.attention", "*.self_attn", "*.attn"),
    *_rules("activation", "*.mlp*", "*.feed_forward*"),
    *_rules("residual", "*.h.*", "*layers.*", op="aten.add*"),
    *_rules("mask", "model", "transformer"),  # Hugging Face builds the causal mask up front
]


@dataclass
class _Tally:
    """The forward work one role holds."""

    flops: int = 0
    masked_flops: int = 0
    sites: set[tuple[str, str]] = field(default_factory=set)
    """(module, op) of each node that put work here."""


def _role(node: NodeRecord, rules: list[MappingRule]) -> str:
    return next((rule.role for rule in rules if rule.matches(node)), "other")


def _parts(node: NodeRecord, role: str) -> list[tuple[str, int, int]]:
    """(role, FLOPs, masked FLOPs) of the parts of one node's cost (module docstring, step 2)."""
    cost = node.cost
    matmul, masked_matmul = FLOPS_PER_MAC * cost.macs, FLOPS_PER_MAC * cost.masked_macs
    rest, masked_rest = cost.flops - matmul, cost.masked_flops - masked_matmul
    if role == "attention":
        # q . k contracts q's last dim E, p . v sums rows of v's last dim Ev: E : Ev of the MACs.
        qk_dim, v_dim = node.inputs[0].shape[-1], node.inputs[2].shape[-1]
        scores = matmul * qk_dim // (qk_dim + v_dim)
        masked_scores = masked_matmul * qk_dim // (qk_dim + v_dim)
        return [("scores", scores, masked_scores),
                ("reduce", matmul - scores, masked_matmul - masked_scores),
                ("attention_rest", rest, masked_rest)]
    if role in MATMUL_ROLES:
        return [(role, matmul, masked_matmul), ("biases", rest, masked_rest)]
    return [(role, cost.flops, cost.masked_flops)]


def _tally(report: Report, rules: list[MappingRule]) -> dict[str, _Tally]:
    tally: dict[str, _Tally] = defaultdict(_Tally)
    for node in report.nodes:
        if node.phase != "forward":
            continue
        for role, flops, masked in _parts(node, _role(node, rules)):
            if flops:
                tally[role].flops += flops
                tally[role].masked_flops += masked
                tally[role].sites.add((node.module, node.op))
    return tally


def breakdown(report: Report, mapping: list[MappingRule] | None = None) -> dict[str, int]:
    """The graph's forward FLOPs per role (`ROLES` order, roles with work only)."""
    tally = _tally(_concrete(report), DEFAULT_MAPPING if mapping is None else mapping)
    return {role: tally[role].flops for role in ROLES if tally[role].flops}


class ComparisonRow(Record):
    """One component: the budget's FLOPs beside the graph's, and why they differ."""

    component: str
    """The budget's name for it, or for work outside the budget ``outside: <role>``, or
    ``graph forward`` for the last row."""
    kind: RowKind
    """``matmul``, ``other`` (a non-matmul budget term) or ``subtotal`` as in the budget;
    ``outside`` for graph work the budget leaves out; ``total`` for the whole forward."""
    roles: list[str]
    """The graph roles counted in this row (`ROLES`); empty for subtotals and the total."""
    budget_flops: int
    """The budget's FLOPs for the whole call (every layer, the batch); 0 outside the budget."""
    counted_flops: int
    """FLOPs the graph's nodes of these roles count."""
    diff_flops: int
    """``counted_flops - budget_flops``."""
    rel_diff: float | None
    """``diff_flops / budget_flops``; None when the budget is 0."""
    reason: str
    """Why the two differ, when known; empty when they agree or the cause is unknown."""


class Comparison(Record):
    """A budget beside the exported graph of one model call."""

    source: str
    """The budget's source, e.g. ``Karpathy, nanoGPT transformer_sizing.ipynb``."""
    url: str
    """Where to read the budget's derivation."""
    scope: str
    """What the budget counts and leaves out."""
    model: str
    """The report's model."""
    config: TransformerConfig
    """The configuration the budget was derived for."""
    mapping: list[MappingRule]
    """The rules that gave each graph node its role."""
    rows: list[ComparisonRow]
    """The budget's items in its order, then work outside the budget, then the total."""

    def row(self, component: str) -> ComparisonRow:
        for row in self.rows:
            if row.component == component:
                return row
        raise KeyError(f"no row {component!r}; rows: {[r.component for r in self.rows]}")


def compare(report: Report, budget: Budget,
            mapping: list[MappingRule] | None = None) -> Comparison:
    """The budget's components beside the graph's forward FLOPs, with reasons.

    ``mapping`` replaces `DEFAULT_MAPPING`; to add rules for a model's own module names, put
    them first: ``[MappingRule(module="*.attn.fused_qkv", role="qkv"), *DEFAULT_MAPPING]``.
    """
    rules = DEFAULT_MAPPING if mapping is None else mapping
    tally = _tally(_concrete(report), rules)
    rows: dict[str, ComparisonRow] = {}
    for item in budget.items:  # subtotals come after their parts
        rows[item.name] = (_subtotal_row(item, rows) if item.kind == "subtotal"
                           else _item_row(item, tally))
    claimed = {role for item in budget.items for role in item.roles}
    outside = [_outside_row(role, tally[role]) for role in ROLES
               if role not in claimed and tally[role].flops]
    leaves = [row for row in rows.values() if row.kind != "subtotal"] + outside
    return Comparison(source=budget.source, url=budget.url, scope=budget.scope,
                      model=report.model, config=budget.config, mapping=rules,
                      rows=[*rows.values(), *outside, _total_row(report, budget, leaves)])


def _concrete(report: Report) -> Report:
    if not isinstance(report.forward.flops, int):
        names = ", ".join(s.name for s in report.symbols)
        raise ValueError(f"the report's counts depend on dynamic sizes ({names}); a budget is "
                         f"for one call: compare report.evaluate({names.split(', ')[0]}=...)")
    return report


def _row(component: str, kind: RowKind, roles: list[str], budget: int, counted: int,
         reason: str) -> ComparisonRow:
    diff = counted - budget
    return ComparisonRow(component=component, kind=kind, roles=roles, budget_flops=budget,
                         counted_flops=counted, diff_flops=diff,
                         rel_diff=diff / budget if budget else None,
                         reason=reason if diff else "")


def _item_row(item: BudgetItem, tally: dict[str, _Tally]) -> ComparisonRow:
    counted = sum(tally[role].flops for role in item.roles)
    masked = sum(tally[role].masked_flops for role in item.roles)
    return _row(item.name, item.kind, list(item.roles), item.flops, counted,
                _item_reason(item, counted, masked))


def _item_reason(item: BudgetItem, counted: int, masked: int) -> str:
    """A convention the graph's count matches exactly, else the source's note with the count
    per unit; empty when nothing explains it."""
    masked_note = (f" ({masked:,} of the graph's FLOPs are on pairs the causal mask discards)"
                   if masked else "")
    for description, flops in item.alternatives.items():
        if flops == counted:
            return f"the graph counts {description}{masked_note}"
    if counted == 0 and item.roles:
        return (f"no graph node has the role {' or '.join(item.roles)}: pass compare() a "
                f"mapping that names this model's modules")
    if not item.note:
        return ""
    # A note says the source counts each unit differently; the graph covers the same units.
    if item.units and not counted % item.units and not item.flops % item.units:
        return (f"{item.note}; the graph counts {counted // item.units:,} FLOPs per "
                f"{item.unit}, the budget {item.flops // item.units:,}")
    return item.note


def _subtotal_row(item: BudgetItem, rows: dict[str, ComparisonRow]) -> ComparisonRow:
    parts = [rows[name] for name in item.parts]
    differing = [part.component for part in parts if part.diff_flops]
    return _row(item.name, "subtotal", [], item.flops, sum(p.counted_flops for p in parts),
                f"from {', '.join(differing)}")


def _outside_row(role: str, tally: _Tally) -> ComparisonRow:
    if role == "other":
        sites = sorted(tally.sites)
        shown = ", ".join(f"{op} in {module or 'the root'}" for module, op in sites[:4])
        more = f" and {len(sites) - 4} more" if len(sites) > 4 else ""
        reason = (f"ops no mapping rule names: {shown}{more}; add MappingRules to give them a "
                  f"role")
    elif role in MATMUL_ROLES:
        reason = f"{ROLES[role]}: a matmul the budget has no component for"
    else:
        reason = f"{ROLES[role]}: not matmuls, outside the budget"
    return _row(f"outside: {role}", "outside", [role], 0, tally.flops, reason)


def _total_row(report: Report, budget: Budget, leaves: list[ComparisonRow]) -> ComparisonRow:
    """The budget's forward total beside every forward FLOP of the graph."""
    differing = [row.component for row in leaves if row.diff_flops]
    reason = f"the differences of {', '.join(differing)}"
    if report.uncounted:
        reason += (f"; {sum(u.calls for u in report.uncounted)} node(s) with no formula count "
                   f"nothing (report.uncounted)")
    return _row("graph forward", "total", [], budget.forward, report.forward.flops, reason)
