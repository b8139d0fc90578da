"""Every training stack's FLOPs convention beside the graph's exact count (issue 52).

- `parts`: the vocabulary both sides are split into (projections, router, experts, norms and
  biases, embedding, output layer, attention, elementwise, backward, recompute, padding),
  the parameter groups read off a report's modules, and the graph's count split the same way;
- `registry`: `StackFormula`, the decorator that registers one stack's published formula, and
  `NotCovered`, what a formula raises for a model its source does not handle;
- `dense`: the formulas that multiply parameter counts (torchtitan, Hugging Face's Trainer,
  PaLM's MFU definition); `configured`: those written on config fields (Megatron-LM, verl,
  TRL); `deepspeed`: DeepSpeed's profiler, its per-call formulas over the calls of a forward
  that `calls` records on fake tensors;
- `translate`: `conventions()`, the record of every stack with the difference split in terms.

This package is not named ``conventions``: that would shadow ``exportflops.conventions``.
"""

from .translate import conventions

__all__ = ["conventions"]
