"""Fast Fourier transforms: ``_fft_c2c``, ``_fft_r2c``, ``_fft_c2r`` (what ``torch.fft`` runs).

Convention (FFTW's benchmark methodology, http://www.fftw.org/speed/method.html): a complex
transform of N points costs 5 N log2 N real FLOPs, a real-data one half that, 2.5 N log2 N. A
transform over several dims of sizes n1, n2, ... is one per dim over all N elements:
5 N (log2 n1 + log2 n2 + ...) = 5 N log2 N. log2 n is rounded up (a length that is not a power
of 2 costs at least as much as the next one up). A normalized transform (``normalization`` 1 or
2: by 1/sqrt(n) or 1/n) adds one multiply per output element. No MACs: the butterflies are not
counted as multiply-accumulates, as fvcore and torch's FlopCounterMode leave FFTs uncounted.
"""

from __future__ import annotations


from .reduce import _ceil_log2
from .registry import Cost, OpCall, register_formula, aten


def _butterflies(complex_elements, sizes) -> object:
    return 5 * complex_elements * sum(_ceil_log2(n) for n in sizes)


def _scaling(call: OpCall):
    return call.out.numel if call.get("normalization", 0) else 0


@register_formula(aten._fft_c2c)
def fft_c2c(call: OpCall) -> Cost:
    x = call["self"]
    sizes = [x.shape[d] for d in call["dim"]]
    return call.cost(flops=_butterflies(x.numel, sizes) + _scaling(call))


@register_formula(aten._fft_r2c)
def fft_r2c(call: OpCall) -> Cost:
    # Real input: half a complex transform of the same number of points.
    x = call["self"]
    sizes = [x.shape[d] for d in call["dim"]]
    return call.cost(flops=_butterflies(x.numel, sizes) // 2 + _scaling(call))


@register_formula(aten._fft_c2r)
def fft_c2r(call: OpCall) -> Cost:
    # Real output of the full length (``last_dim_size``): half a complex transform of its points.
    out = call.out
    sizes = [out.shape[d] for d in call["dim"]]
    return call.cost(flops=_butterflies(out.numel, sizes) // 2 + _scaling(call))
