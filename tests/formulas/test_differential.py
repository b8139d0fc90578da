"""Differential tests: our contraction counts equal torch.utils.flop_counter's on random shapes.

Source of every expected number: ``torch.utils.flop_counter`` (PyTorch's FlopCounterMode and its
per-op formulas ``mm_flop``, ``addmm_flop``, ``bmm_flop``, ``baddbmm_flop``, ``conv_flop_count``,
``sdpa_flop_count``), used two ways:

1. torch's formula applied to each case's shapes (shapes mapped to the formula's operands by
   arithmetic written here: a 1-D matmul operand is a one-row or one-column matrix, broadcast batch
   dims multiply into the bmm batch, an einsum's letters group into batch/M/N/K);
2. ``FlopCounterMode`` run end to end on the very module and meta inputs we export. On meta tensors
   SDPA takes the math path (two bmm), so torch counts it; on CPU tensors it would take
   ``_scaled_dot_product_flash_attention_for_cpu``, for which torch 2.13 has no formula
   (pytorch#195460).

3. the formulas alone on shapes hypothesis draws, zero-size dims included (section 3 at the end),
   each also a non-negative integer count.

torch counts 2 FLOPs per MAC and ignores bias / ``beta * self`` terms and softmax, so the figure
compared is our ``matmul_flops`` (2 x macs), not ``flops``.

Each family draws at least 50 cases from a ``random.Random`` seeded with the family's name.
Exporting one module per case would be slow, so each family is one module: case ``i`` runs in
submodule ``cases.i``, and a case's count is the sum over the nodes attributed to that path.
"""

from __future__ import annotations

import functools
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    addmm_flop,
    baddbmm_flop,
    bmm_flop,
    conv_flop_count,
    flop_registry,
    mm_flop,
    sdpa_flop_count,
)

from exportflops import OpCall, TensorMeta, analyze
from exportflops.formulas import FORMULAS

CASES_PER_FAMILY = 80


@dataclass(frozen=True)
class Case:
    id: str
    op: Callable
    """Called as ``op(*tensors)``; scalar arguments are bound in (functools.partial)."""
    tensors: tuple
    torch_formula_flops: int
    """torch.utils.flop_counter's formula on this case's shapes."""
    flop_counter_sees: bool = True
    """Whether FlopCounterMode has a formula for the ops torch lowers this call to."""


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def dims(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def size(rng: random.Random, hi: int = 9, *, zero: float = 0.03, one: float = 0.2) -> int:
    """A dimension: sometimes 0 (where torch allows it) or 1, else 2..hi."""
    r = rng.random()
    return 0 if r < zero else 1 if r < zero + one else rng.randint(2, hi)


# ---------------------------------------------------------------------------------------------
# Matrix products


def linear_case(rng: random.Random) -> Case:
    batch = [size(rng, 5) for _ in range(rng.randint(0, 3))]
    fin, fout = size(rng), size(rng)
    x, w = meta(*batch, fin), meta(fout, fin)
    bias = rng.random() < 0.5
    tensors = (x, w, meta(fout)) if bias else (x, w)
    # F.linear is x viewed as (rows, in) @ w.T (in, out); torch lowers it to mm / addmm.
    expected = mm_flop((math.prod(batch), fin), (fin, fout))
    return Case(f"x{dims(x.shape)}-w{dims(w.shape)}{'-bias' if bias else ''}", F.linear, tensors,
                expected)


def mm_case(rng: random.Random) -> Case:
    m, k, n = size(rng), size(rng), size(rng)
    return Case(f"m{m}-k{k}-n{n}", torch.mm, (meta(m, k), meta(k, n)), mm_flop((m, k), (k, n)))


def addmm_case(rng: random.Random) -> Case:
    m, k, n = size(rng), size(rng), size(rng)
    bias_shape = rng.choice([(n,), (m, n), (1, n), (m, 1), ()])
    beta, alpha = rng.choice([1, 0, 0.5]), rng.choice([1, 2.0])
    op = functools.partial(torch.addmm, beta=beta, alpha=alpha)
    return Case(f"self{dims(bias_shape)}-m{m}-k{k}-n{n}-beta{beta}-alpha{alpha}", op,
                (meta(*bias_shape), meta(m, k), meta(k, n)),
                addmm_flop(bias_shape, (m, k), (k, n)))


def bmm_case(rng: random.Random) -> Case:
    b, m, k, n = size(rng, 5), size(rng), size(rng), size(rng)
    return Case(f"b{b}-m{m}-k{k}-n{n}", torch.bmm, (meta(b, m, k), meta(b, k, n)),
                bmm_flop((b, m, k), (b, k, n)))


def baddbmm_case(rng: random.Random) -> Case:
    b, m, k, n = size(rng, 5), size(rng), size(rng), size(rng)
    self_shape = rng.choice([(b, m, n), (m, n), (n,), (1, 1, n), (b, 1, n), ()])
    beta, alpha = rng.choice([1, 0, 0.5]), rng.choice([1, 2.0])
    op = functools.partial(torch.baddbmm, beta=beta, alpha=alpha)
    return Case(f"self{dims(self_shape)}-b{b}-m{m}-k{k}-n{n}-beta{beta}-alpha{alpha}", op,
                (meta(*self_shape), meta(b, m, k), meta(b, k, n)),
                baddbmm_flop(self_shape, (b, m, k), (b, k, n)))


def matmul_as_bmm_flops(a: tuple, b: tuple) -> int:
    """torch's bmm formula for torch.matmul(a, b), by torch.matmul's documented semantics:
    1. a 1-D left operand is a row (1, k), a 1-D right operand a column (k, 1);
    2. the dims before the last two broadcast, and their product is the bmm batch."""
    m, k = (1, a[0]) if len(a) == 1 else a[-2:]
    k2, n = (b[0], 1) if len(b) == 1 else b[-2:]
    batch = math.prod(torch.broadcast_shapes(a[:-2], b[:-2]))
    return bmm_flop((batch, m, k), (batch, k2, n))


def _batch_pair(rng: random.Random, rank_a: int, rank_b: int) -> tuple[list[int], list[int]]:
    """Leading dims of two operands that broadcast: right-aligned, each pair equal or one is 1."""
    a, b = [], []
    for i in range(max(rank_a, rank_b)):  # innermost first
        d = size(rng, 4)
        if i < rank_a:
            a.append(d if rng.random() < 0.7 else 1)
        if i < rank_b:
            b.append(d if rng.random() < 0.7 else 1)
    return a[::-1], b[::-1]


def matmul_case(rng: random.Random, *, vector_right: bool) -> Case:
    m, k, n = size(rng), size(rng), size(rng)
    rank_a = rng.choice([1, 2, 3, 3, 4] if vector_right else [1, 2, 3, 4])
    rank_b = 1 if vector_right else rng.choice([2, 3, 4])
    batch_a, batch_b = _batch_pair(rng, max(rank_a - 2, 0), max(rank_b - 2, 0))
    a = (k,) if rank_a == 1 else (*batch_a, m, k)
    b = (k,) if rank_b == 1 else (*batch_b, k, n)
    return Case(f"a{dims(a)}-b{dims(b)}", torch.matmul, (meta(*a), meta(*b)),
                matmul_as_bmm_flops(a, b))


def shuffled(rng: random.Random, letters: list[str]) -> list[str]:
    return rng.sample(letters, k=len(letters))


def einsum_case(rng: random.Random) -> Case:
    """A two-operand contraction: every letter is batch (both operands and output), M (left and
    output), N (right and output) or K (both operands, summed). torch's count is the bmm of
    (B, M, K) @ (B, K, N), each group the product of its letters' sizes, the broadcast '...' dims
    being batch too."""
    labels = iter(rng.sample(string.ascii_letters, 8))
    groups = {g: [next(labels) for _ in range(rng.randint(lo, 2))]
              for g, lo in (("batch", 0), ("m", 0), ("n", 0), ("k", 1))}
    implicit = rng.random() < 0.2
    if implicit:  # no '->': the output is the letters used once, so batch letters are summed
        groups["k"] += groups["batch"]
        groups["batch"] = []
    sizes = {c: size(rng, 5) for letters in groups.values() for c in letters}
    left, right, out = (shuffled(rng, [c for g in term for c in groups[g]])
                        for term in (("batch", "m", "k"), ("batch", "k", "n"), ("batch", "m", "n")))
    ellipsis_a, ellipsis_b = [], []
    if rng.random() < 0.4:  # '...' dims, broadcast like matmul's batch dims, anywhere in a term
        ellipsis_a, ellipsis_b = _batch_pair(rng, rng.randint(0, 2), rng.randint(0, 2))
        left, right = (insert_dots(rng, term) if dims_ or rng.random() < 0.5 else term
                       for term, dims_ in ((left, ellipsis_a), (right, ellipsis_b)))
        if "..." in left + right:
            out = insert_dots(rng, out)
    a = tuple(d for c in left for d in (ellipsis_a if c == "..." else [sizes[c]]))
    b = tuple(d for c in right for d in (ellipsis_b if c == "..." else [sizes[c]]))
    equation = f"{''.join(left)},{''.join(right)}" + ("" if implicit else f"->{''.join(out)}")
    batch = (math.prod(sizes[c] for c in groups["batch"])
             * math.prod(torch.broadcast_shapes(tuple(ellipsis_a), tuple(ellipsis_b))))
    m, n, k = (math.prod(sizes[c] for c in groups[g]) for g in ("m", "n", "k"))
    return Case(f"{equation.replace('->', '_to_')}-a{dims(a)}-b{dims(b)}",
                functools.partial(torch.einsum, equation), (meta(*a), meta(*b)),
                bmm_flop((batch, m, k), (batch, k, n)))


def insert_dots(rng: random.Random, term: list[str]) -> list[str]:
    at = rng.randint(0, len(term))
    return [*term[:at], "...", *term[at:]]


# ---------------------------------------------------------------------------------------------
# Convolutions

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def aten_convolution(x, weight, bias=None, *, stride, padding, dilation, transposed,
                     output_padding, groups):
    """aten.convolution called directly, as a decomposed graph holds every convolution."""
    return torch.convolution(x, weight, bias, stride, padding, dilation, transposed,
                             output_padding, groups)


def conv_case(rng: random.Random, d: int, *, transposed: bool) -> Case:
    if rng.random() < 0.25:  # depthwise: one input channel per group, groups == C_in
        groups, cin_g, cout_g, tag = rng.randint(2, 6), 1, rng.choice([1, 2]), "dw"
    else:
        groups, cin_g, cout_g = rng.choice([1, 1, 2, 3]), rng.randint(1, 4), rng.randint(1, 4)
        tag = f"g{groups}"
    c_in, c_out = groups * cin_g, groups * cout_g
    kernel = [rng.choice([1, 1, 2, 3, 4]) for _ in range(d)]
    stride = [rng.randint(1, 3) for _ in range(d)]
    dilation = [rng.randint(1, 3) for _ in range(d)]
    # torch requires output_padding < max(stride, dilation)
    output_padding = [rng.randrange(max(s, dl)) if transposed else 0
                      for s, dl in zip(stride, dilation)]
    padding_mode = "int" if transposed else rng.choice(["int", "int", "int", "same", "valid"])
    if padding_mode == "same":
        stride = [1] * d  # torch allows padding='same' only with stride 1
    spatial, padding = [], []
    for k, s, dl, op in zip(kernel, stride, dilation, output_padding):
        if transposed:
            n = rng.randint(1, 5)
            # out = (n - 1) s - 2 p + dl (k - 1) + op + 1 must stay >= 1
            p = rng.randint(0, min(2, ((n - 1) * s + dl * (k - 1) + op) // 2))
        else:
            p = rng.randint(0, 2) if padding_mode == "int" else 0
            # out = floor((n + 2 p - dl (k - 1) - 1) / s) + 1 must stay >= 1
            n = max(1, dl * (k - 1) + 1 - 2 * p) + rng.randint(0, 4)
        spatial.append(n)
        padding.append(p)
    weight = (c_in, cout_g, *kernel) if transposed else (c_out, cin_g, *kernel)
    geometry = {"stride": tuple(stride), "dilation": tuple(dilation), "groups": groups}
    direct = padding_mode == "int" and rng.random() < 0.2
    if direct:
        op = functools.partial(aten_convolution, padding=tuple(padding), transposed=transposed,
                               output_padding=tuple(output_padding), **geometry)
    elif transposed:
        op = functools.partial(CONV_TRANSPOSE[d], padding=tuple(padding),
                               output_padding=tuple(output_padding), **geometry)
    else:
        op = functools.partial(CONV[d], **geometry,
                               padding=tuple(padding) if padding_mode == "int" else padding_mode)
    x = meta(rng.choice([0, 1, 1, 2, 3]) if rng.random() < 0.5 else size(rng, 3), c_in, *spatial)
    bias = rng.random() < 0.5
    tensors = (x, meta(*weight), meta(c_out)) if bias else (x, meta(*weight))
    out = op(*tensors)  # torch's own shape inference, on meta

    def csv(values) -> str:
        return ",".join(map(str, values))

    case_id = "-".join([
        tag, f"x{dims(x.shape)}", f"w{dims(weight)}", f"s{csv(stride)}",
        f"p{csv(padding) if padding_mode == 'int' else padding_mode}", f"d{csv(dilation)}",
        *([f"op{csv(output_padding)}"] if transposed else []),
        *(["bias"] if bias else []), *(["aten"] if direct else []),
    ])
    return Case(case_id, op, tensors,
                conv_flop_count(tuple(x.shape), weight, tuple(out.shape), transposed=transposed))


# ---------------------------------------------------------------------------------------------
# Attention


def as_bhld(shape: tuple) -> tuple:
    """SDPA's (..., heads, L, E) as sdpa_flop_count's (batch, heads, L, E): the dims before the
    heads multiply into the batch; 3-D (N, L, E) inputs are one batch of N heads."""
    return (math.prod(shape[:-3]), *shape[-3:])


def sdpa_case(rng: random.Random) -> Case:
    layout = rng.choice(["4d", "4d", "gqa", "gqa", "3d", "5d"])
    lq, lkv, e, ev = size(rng, 12), size(rng, 12, zero=0), size(rng, 16, zero=0), size(rng, 16)
    kwargs: dict = {}
    if layout == "gqa":
        h_q = rng.choice([2, 4, 6, 8, 12])
        h_kv = rng.choice([d for d in range(1, h_q) if h_q % d == 0])
        lead = (size(rng, 3), h_q)
        lead_kv = (lead[0], h_kv)
        kwargs["enable_gqa"] = True
    else:
        # torch's sdpa_flop_count divides by the key's heads: no zero-size heads dim.
        lead = {"3d": (size(rng, 4, zero=0),), "4d": (size(rng, 3), size(rng, 6, zero=0)),
                "5d": (size(rng, 2), size(rng, 3), size(rng, 4, zero=0))}[layout]
        lead_kv = lead
    q, k, v = (*lead, lq, e), (*lead_kv, lkv, e), (*lead_kv, lkv, ev)
    tensors = [meta(*q), meta(*k), meta(*v)]
    mask = rng.choice(["none", "none", "causal", "bool", "float"])
    if mask == "causal":
        kwargs["is_causal"] = True
    elif mask != "none":
        # a mask broadcast over the leading dims (heads included)
        tensors.append(torch.empty(lq, lkv, device="meta",
                                   dtype=torch.bool if mask == "bool" else torch.float32))
    if rng.random() < 0.3:
        kwargs["scale"] = rng.choice([0.125, 1.0, 0.3])
    if rng.random() < 0.15:
        kwargs["dropout_p"] = 0.1
    op = functools.partial(F.scaled_dot_product_attention, **kwargs)
    extras = "".join(f"-{key}{'' if val is True else val}" for key, val in kwargs.items())
    case_id = f"{layout}-q{dims(q)}-k{dims(k)}-v{dims(v)}-{mask}{extras}"
    return Case(case_id, op, tuple(tensors), sdpa_flop_count(as_bhld(q), as_bhld(k), as_bhld(v)))


# ---------------------------------------------------------------------------------------------
# The families

GENERATORS: dict[str, Callable[[random.Random], Case]] = {
    "linear": linear_case,
    "mm": mm_case,
    "addmm": addmm_case,
    "bmm": bmm_case,
    "baddbmm": baddbmm_case,
    "matmul": functools.partial(matmul_case, vector_right=False),
    "matmul_vector": functools.partial(matmul_case, vector_right=True),
    "einsum": einsum_case,
    **{f"conv{d}d": functools.partial(conv_case, d=d, transposed=False) for d in (1, 2, 3)},
    **{f"conv_transpose{d}d": functools.partial(conv_case, d=d, transposed=True)
       for d in (1, 2, 3)},
    "sdpa": sdpa_case,
}

class DispatchedOps(TorchDispatchMode):
    """Records the aten ops a call dispatches to: torch's own lowering of a composite op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def flop_counter_sees(op: Callable, tensors: tuple) -> bool:
    """Whether torch lowers this call to an op FlopCounterMode has a formula for.

    Not always: torch.matmul lowers a 1-D right operand (and a 1-D left one times a foldable
    batched right one) to aten.dot / aten.mv, and torch.einsum a contraction whose summed size is 1
    to aten.mul; flop_counter has no formula for those, so it counts such a call as 0. Those cases
    are compared with torch's formula on shapes only.
    """
    with DispatchedOps() as seen:
        op(*tensors)
    return any(packet in flop_registry for packet in seen.ops)


def draw(family: str) -> list[Case]:
    rng = random.Random(family)
    cases = [GENERATORS[family](rng) for _ in range(CASES_PER_FAMILY)]
    return [Case(f"{i:02d}-{c.id}", c.op, c.tensors, c.torch_formula_flops,
                 flop_counter_sees(c.op, c.tensors))
            for i, c in enumerate(cases)]


FAMILIES = {family: draw(family) for family in GENERATORS}


class Call(nn.Module):
    def __init__(self, op: Callable) -> None:
        super().__init__()
        self.op = op

    def forward(self, *tensors):
        return self.op(*tensors)


class Family(nn.Module):
    """Case i runs in submodule ``cases.i``."""

    def __init__(self, cases: list[Case]) -> None:
        super().__init__()
        self.cases = nn.ModuleList(Call(c.op) for c in cases)

    def forward(self, inputs):
        return [call(*tensors) for call, tensors in zip(self.cases, inputs, strict=True)]


@dataclass(frozen=True)
class Counted:
    report: object
    ours: list[int]
    """Our matmul_flops per case: the nodes attributed to ``cases.i``."""
    flop_counter: list[int]
    """FlopCounterMode's FLOPs per case, for the same module and inputs."""
    flop_counter_total: int


@functools.cache
def counted(family: str) -> Counted:
    cases = FAMILIES[family]
    module, inputs = Family(cases), [c.tensors for c in cases]
    report = analyze(module, (inputs,))
    ours = [sum(n.cost.matmul_flops for n in report.nodes if n.module == f"cases.{i}")
            for i in range(len(cases))]
    with FlopCounterMode(display=False) as mode:
        module(inputs)
    per_module = mode.get_flop_counts()
    theirs = [sum(per_module.get(f"Family.cases.{i}", {}).values()) for i in range(len(cases))]
    return Counted(report, ours, theirs, mode.get_total_flops())


def params(seen_by_flop_counter_only: bool = False) -> list:
    return [pytest.param(family, i, id=f"{family}-{case.id}")
            for family, cases in FAMILIES.items() for i, case in enumerate(cases)
            if case.flop_counter_sees or not seen_by_flop_counter_only]


@pytest.mark.parametrize(("family", "i"), params())
def test_matmul_flops_equal_torch_formula_on_the_same_shapes(family, i):
    assert counted(family).ours[i] == FAMILIES[family][i].torch_formula_flops


@pytest.mark.parametrize(("family", "i"), params(seen_by_flop_counter_only=True))
def test_matmul_flops_equal_flop_counter_mode_on_the_same_module(family, i):
    assert counted(family).ours[i] == counted(family).flop_counter[i]


@pytest.mark.parametrize("family", list(GENERATORS))
def test_family_total_equals_the_sum_of_torch_formulas(family):
    assert counted(family).report.total.matmul_flops == sum(
        c.torch_formula_flops for c in FAMILIES[family])


@pytest.mark.parametrize("family", list(GENERATORS))
def test_flop_counter_mode_total_equals_our_count_of_the_calls_it_sees(family):
    ours = counted(family).ours
    seen = [i for i, c in enumerate(FAMILIES[family]) if c.flop_counter_sees]
    assert counted(family).flop_counter_total == sum(ours[i] for i in seen)


@pytest.mark.parametrize("family", list(GENERATORS))
def test_every_case_is_counted_by_a_formula(family):
    report = counted(family).report
    assert report.uncounted == []
    for i in range(len(FAMILIES[family])):
        statuses = [n.status for n in report.nodes if n.module == f"cases.{i}"]
        assert "counted" in statuses, f"case {i} has no counted node: {statuses}"


@pytest.mark.parametrize("family", list(GENERATORS))
def test_each_family_draws_at_least_50_distinct_cases_with_nonzero_work(family):
    nonzero = {c.id.split("-", 1)[1] for c in FAMILIES[family] if c.torch_formula_flops > 0}
    assert len(nonzero) >= 50


def _zero_size(case: Case) -> bool:
    return any(t.numel() == 0 for t in case.tensors)


def _batch_one(case: Case) -> bool:
    return case.tensors[0].ndim >= 3 and case.tensors[0].shape[0] == 1


def _summed_letters(case: Case) -> set[str]:
    """Letters of both operands missing from the output (implicit output: letters used once)."""
    spec = case.id.split("-")[1]
    operands, arrow, out = spec.partition("_to_")
    left, right = (set(term.replace("...", "")) for term in operands.split(","))
    if not arrow:
        return left & right
    return (left & right) - set(out)


CONV_FAMILIES = [f for f in GENERATORS if f.startswith("conv")]
EDGE_CASES = [
    *((f, "zero-size", _zero_size) for f in GENERATORS),
    *((f, "batch-1", _batch_one) for f in ("bmm", "baddbmm", *CONV_FAMILIES, "sdpa")),
    *((f, "depthwise", lambda c: c.id.split("-")[1] == "dw") for f in CONV_FAMILIES),
    *((f, "1x1-kernel", lambda c: set(c.tensors[1].shape[2:]) == {1}) for f in CONV_FAMILIES),
    *((f, "padding-same", lambda c: "-psame-" in c.id) for f in ("conv1d", "conv2d", "conv3d")),
    *((f, "bias", lambda c: "-bias" in c.id) for f in ("linear", *CONV_FAMILIES)),
    *((f, "aten.convolution", lambda c: c.id.endswith("-aten")) for f in CONV_FAMILIES),
    ("addmm", "beta-0", lambda c: "-beta0-" in c.id),
    ("baddbmm", "beta-0", lambda c: "-beta0-" in c.id),
    ("sdpa", "gqa", lambda c: "enable_gqa" in c.id),
    ("sdpa", "causal", lambda c: "-causal" in c.id),
    ("sdpa", "mask", lambda c: len(c.tensors) == 4),
    ("sdpa", "3d-inputs", lambda c: c.tensors[0].ndim == 3),
    ("sdpa", "lq-ne-lkv", lambda c: c.tensors[0].shape[-2] != c.tensors[1].shape[-2]),
    ("sdpa", "e-ne-ev", lambda c: c.tensors[0].shape[-1] != c.tensors[2].shape[-1]),
    ("matmul", "broadcast-batch", lambda c: c.tensors[0].ndim >= 3 and c.tensors[1].ndim >= 3
     and c.tensors[0].shape[:-2] != c.tensors[1].shape[:-2]),
    ("matmul", "1d-left", lambda c: c.tensors[0].ndim == 1),
    ("matmul_vector", "dot", lambda c: c.tensors[0].ndim == 1),
    ("matmul_vector", "batched-mv", lambda c: c.tensors[0].ndim >= 3),
    ("einsum", "ellipsis", lambda c: "..." in c.id),
    ("einsum", "ellipsis-mid-term", lambda c: any(
        t.strip(".") != t.replace("...", "")
        for t in c.id.split("-")[1].replace("_to_", ",").split(","))),
    ("einsum", "implicit-output", lambda c: "_to_" not in c.id),
    ("einsum", "several-summed-letters", lambda c: len(_summed_letters(c)) >= 2),
]


@pytest.mark.parametrize(("family", "what", "predicate"),
                         [pytest.param(*e, id=f"{e[0]}-{e[1]}") for e in EDGE_CASES])
def test_the_draw_covers_edge_cases(family, what, predicate):
    assert any(predicate(c) for c in FAMILIES[family]), f"no {family} case with {what}"


# --- 3. The formulas alone, drawn by hypothesis: zero-size dims, batch 1 and groups = channels
# included, each equal to torch's formula and every count a non-negative integer.

HYPOTHESIS = settings(max_examples=60, deadline=None)
any_size = st.integers(min_value=0, max_value=9)
aten = torch.ops.aten
positive = st.integers(min_value=1, max_value=6)


def tensor_meta(*shape) -> TensorMeta:
    return TensorMeta(tuple(shape), torch.float32)


def formula_count(op, args: dict, out_shape) -> object:
    return FORMULAS.lookup(op).formula(OpCall(op, args, (tensor_meta(*out_shape),)))


def assert_natural(cost) -> None:
    for value in (cost.flops, cost.macs, cost.bytes_read, cost.bytes_written):
        assert isinstance(value, int) and value >= 0


@HYPOTHESIS
@given(any_size, any_size, any_size)
def test_mm(m, k, n):
    operands = {"self": tensor_meta(m, k), "mat2": tensor_meta(k, n)}
    cost = formula_count(aten.mm.default, operands, (m, n))
    assert_natural(cost)
    assert 2 * cost.macs == mm_flop((m, k), (k, n))


@HYPOTHESIS
@given(any_size, any_size, any_size, any_size)
def test_bmm(b, m, k, n):
    operands = {"self": tensor_meta(b, m, k), "mat2": tensor_meta(b, k, n)}
    cost = formula_count(aten.bmm.default, operands, (b, m, n))
    assert_natural(cost)
    assert 2 * cost.macs == bmm_flop((b, m, k), (b, k, n))


@st.composite
def convolutions(draw):
    groups = draw(st.integers(1, 4))
    depthwise = draw(st.booleans())
    c_in = groups * (1 if depthwise else draw(positive))
    c_out = groups * draw(positive)
    kernel = draw(st.integers(1, 3))
    stride, padding = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    dilation = draw(st.integers(1, 2))
    batch = draw(st.integers(0, 3))
    side = draw(st.integers(dilation * (kernel - 1) + 1 - 2 * padding, 9).filter(lambda s: s >= 1))
    transposed = draw(st.booleans())
    return batch, c_in, c_out, groups, kernel, side, stride, padding, dilation, transposed


@HYPOTHESIS
@given(convolutions())
def test_convolution(case):
    batch, c_in, c_out, groups, kernel, side, stride, padding, dilation, transposed = case
    x = torch.empty(batch, c_in, side, side, device="meta")
    if transposed:  # output side (side - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1
        assume((side - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 >= 1)
        w = torch.empty(c_in, c_out // groups, kernel, kernel, device="meta")
        out = F.conv_transpose2d(x, w, stride=stride, padding=padding, dilation=dilation,
                                 groups=groups)
    else:
        w = torch.empty(c_out, c_in // groups, kernel, kernel, device="meta")
        out = F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    args = {"input": tensor_meta(*x.shape), "weight": tensor_meta(*w.shape), "bias": None,
            "stride": [stride] * 2, "padding": [padding] * 2, "dilation": [dilation] * 2,
            "transposed": transposed, "output_padding": [0, 0], "groups": groups}
    cost = formula_count(aten.convolution.default, args, tuple(out.shape))
    assert_natural(cost)
    assert 2 * cost.macs == conv_flop_count(x.shape, w.shape, out.shape, transposed=transposed)


@HYPOTHESIS
@given(positive, positive, any_size, any_size, positive, positive)
def test_sdpa(batch, heads, q_len, kv_len, e, ev):
    q, k = tensor_meta(batch, heads, q_len, e), tensor_meta(batch, heads, kv_len, e)
    v = tensor_meta(batch, heads, kv_len, ev)
    args = {"query": q, "key": k, "value": v, "attn_mask": None, "dropout_p": 0.0,
            "is_causal": False, "scale": None, "enable_gqa": False}
    cost = formula_count(aten.scaled_dot_product_attention.default, args, (batch, heads, q_len, ev))
    assert_natural(cost)
    assert 2 * cost.macs == sdpa_flop_count(q.shape, k.shape, v.shape)
