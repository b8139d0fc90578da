"""Reductions, scans, softmax and accumulating scatters: FLOPs per element *read*."""

from __future__ import annotations

import math

import sympy

from .registry import Cost, OpCall, aten_ops, register_formula, aten


#: max (1) + subtract (1) + exp (1) + sum (1) + divide (1), per element: the ops softmax
#: decomposes into (torch._decomp's _softmax), so a fused softmax and its decomposition agree.
SOFTMAX_FLOPS_PER_ELEMENT = 5


@register_formula(aten.sum, aten.prod, aten.amax, aten.amin, aten.max, aten.min, aten.argmax,
                  aten.argmin, aten.any, aten.all, aten._is_all_true, aten.count_nonzero,
                  aten.nansum, aten.cumsum, aten.cumprod, aten.cummax, aten.cummin)
def reduction(call: OpCall) -> Cost:
    # One add, multiply or compare per element read (n-1 for n elements, rounded up to n as
    # fvcore and torchinfo do). Binary max/min (elementwise) have two inputs and are pointwise.
    inputs = list(call.tensor_inputs())
    if len(inputs) == 2:
        return call.cost(flops=call.out.numel)
    return call.cost(flops=inputs[0].numel)


@register_formula(aten.segment_reduce)
def segment_reduce(call: OpCall) -> Cost:
    """Segments of ``data`` along ``axis`` (their lengths or offsets given) each reduced: one
    add, multiply or compare per element read, as `reduction`; ``'mean'`` divides once per
    output element."""
    means = call.out.numel if call["reduce"] == "mean" else 0
    return call.cost(flops=call["data"].numel + means)


@register_formula(aten.multinomial)
def multinomial(call: OpCall) -> Cost:
    """Samples from each row of n weights, as ATen's kernel draws them: with replacement, the
    cumulative distribution (n adds) normalized (n divides), then a binary search per sample
    (ceil(log2 n) compares); without, each weight divided by an exponential draw (n) and the
    top num_samples selected (n compares). The random draws themselves count 0, as creation
    ops' do."""
    weights = call["self"]
    n, rows = weights.shape[-1], math.prod(weights.shape[:-1])
    if call.get("replacement", False):
        return call.cost(flops=rows * (2 * n + call["num_samples"] * _ceil_log2(n)))
    return call.cost(flops=rows * 2 * n)


@register_formula(aten.mean, aten.nanmean)
def mean(call: OpCall) -> Cost:
    # Sum every element read, then one divide per output element.
    return call.cost(flops=call["self"].numel + call.out.numel)


@register_formula(aten.var, aten.std, aten.var_mean, aten.std_mean)
def variance(call: OpCall) -> Cost:
    # mean (1 add), subtract the mean (1), square (1), sum (1) per element; std adds a sqrt per
    # output, var_mean/std_mean a divide per output for the mean they also return.
    # prims.var names its input inp.
    return call.cost(flops=4 * call.get("self", call.get("inp")).numel + call.out.numel)


@register_formula(aten.linalg_vector_norm, aten.norm, aten.frobenius_norm)
def vector_norm(call: OpCall) -> Cost:
    # |x|^p (1) and sum (1) per element, the p-th root per output.
    return call.cost(flops=2 * call["self"].numel + call.out.numel)


@register_formula(aten._cdist_forward)
def cdist(call: OpCall) -> Cost:
    """p-norm distance of every row of x1 (B, P, M) to every row of x2 (B, R, M): per pair and
    feature a subtract, |d|^p and an add (as `vector_norm`), then the p-th root per pair."""
    pairs, features = call.out.numel, call["x1"].shape[-1]
    return call.cost(flops=pairs * (3 * features + 1))


@register_formula(aten._pdist_forward)
def pdist(call: OpCall) -> Cost:
    """The same per pair over the N(N-1)/2 pairs of rows of one (N, M) input (the output)."""
    return call.cost(flops=call.out.numel * (3 * call["self"].shape[-1] + 1))


@register_formula(aten.logsumexp)
def logsumexp(call: OpCall) -> Cost:
    # max (1), subtract (1), exp (1), sum (1) per element; log and add-back per output.
    return call.cost(flops=4 * call["self"].numel + 2 * call.out.numel)


@register_formula(aten.logcumsumexp)
def logcumsumexp(call: OpCall) -> Cost:
    # Per element, the running value and the element combined as ATen's _log_add_exp_helper
    # does: min, max, subtract, exp, log1p, add.
    return call.cost(flops=6 * call["self"].numel)


@register_formula(aten._softmax, aten.softmax, aten._log_softmax, aten.log_softmax,
                  aten._safe_softmax)
def softmax(call: OpCall) -> Cost:
    # log_softmax: max, subtract, exp, sum, then subtract log(sum): also 5 per element.
    return call.cost(flops=SOFTMAX_FLOPS_PER_ELEMENT * call["self"].numel)


@register_formula(aten.scatter_add, aten.scatter_add_, aten.index_add, aten.index_add_,
                  aten.scatter_reduce, aten.scatter_reduce_, aten.index_reduce,
                  aten.index_reduce_)
def accumulating_scatter(call: OpCall) -> Cost:
    # One add (or reduce step) per source element.
    return call.cost(flops=call.get("src", call.get("source")).numel)


@register_formula(*aten_ops("scatter.reduce", "scatter.value_reduce", "scatter.reduce_out",
                             "scatter.value_reduce_out", "scatter_.reduce",
                             "scatter_.value_reduce"))
def reducing_scatter(call: OpCall) -> Cost:
    """``scatter(..., reduce="add" | "multiply")``: one add or multiply per position of
    ``index`` (``src`` is read there; a scalar ``value`` is used there). Plain scatter moves data
    (zero.py)."""
    return call.cost(flops=call["index"].numel)


@register_formula(aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index_put)
def index_put(call: OpCall) -> Cost:
    # accumulate=True adds each value into its place; otherwise a plain write.
    return call.cost(flops=call["values"].numel if call.get("accumulate") else 0)


@register_formula(aten.index_copy, aten.index_copy_)
def index_copy(call: OpCall) -> Cost:
    """Copies ``source`` into rows of ``self``, no arithmetic. In place (a static KV cache's
    update) it reads the source and the index and writes the source's rows only; out of place
    it also copies ``self`` whole."""
    if call.op is aten.index_copy_.default:
        moved = call["source"].nbytes
        return Cost(bytes_read=moved + call["index"].nbytes, bytes_written=moved)
    return call.cost()


@register_formula(aten.topk, aten.kthvalue, aten.median, aten.nanmedian, aten.histc,
                  aten.bincount)
def selection(call: OpCall) -> Cost:
    # Like max: one compare (or bin step) per element read; topk's partial ordering of the k
    # winners (k log k) is not counted.
    return call.cost(flops=call["self"].numel)


@register_formula(aten.sort, aten.argsort, aten.msort)
def sort(call: OpCall) -> Cost:
    """A comparison sort: ceil(log2 L) compares per element, L the sorted dimension's length."""
    x = call["self"]
    if x.ndim == 0:
        return call.cost()
    length = x.shape[call.get("dim", -1) % x.ndim]
    return call.cost(flops=x.numel * _ceil_log2(length))


@register_formula(aten.searchsorted, aten.bucketize)
def binary_search(call: OpCall) -> Cost:
    """A binary search per value over n sorted boundaries: ceil(log2(n + 1)) compares, one
    halving of the n + 1 slots each (MusicFlamingo's rotary time buckets)."""
    boundaries = call.get("sorted_sequence") or call["boundaries"]
    values = call["self"]
    count = values.numel if hasattr(values, "numel") else 1  # the .Scalar overloads: one value
    return call.cost(flops=count * _ceil_log2(boundaries.shape[-1] + 1))


@register_formula(aten.unique_consecutive)
def unique_consecutive(call: OpCall) -> Cost:
    """One compare of each element with its neighbour (along ``dim``, else flattened): runs of
    equal values collapse (Qwen2.5-VL's window index). The counts and inverse are indices."""
    return call.cost(flops=call["self"].numel)


@register_formula(aten._unique, aten._unique2, aten.unique_dim, aten.mode)
def unique(call: OpCall) -> Cost:
    """A sort, then each element compared with its neighbour: ceil(log2 L) + 1 compares per
    element, L the sorted length (the elements, or ``dim``'s slices for unique_dim). ``mode``
    is the same per slice along ``dim`` (its default, -1): ATen sorts each slice and finds the
    longest run of equal values in one pass."""
    x = call["self"]
    dim = call.get("dim", -1 if call.packet == "mode" else None)
    length = x.numel if dim is None or x.ndim == 0 else x.shape[dim % x.ndim]
    return call.cost(flops=x.numel * (_ceil_log2(length) + 1))


def _ceil_log2(n):
    if isinstance(n, int):
        return max(n - 1, 0).bit_length()
    return sympy.ceiling(sympy.log(n, 2))
