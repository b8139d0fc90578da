"""`conventions`: what each stack would log for a model's training step, beside the graph's
exact count, the difference split into the parts of `parts.PARTS`.

1. The graph's side: the train-mode report split by part (`parts.graph_parts`). For a
   `FlopsPerBatch` and a batch, the report evaluated at the batch's sizes (what runs, padding
   included); the count is the batch's ``model_flops``, so the padding term is what runs on
   padded positions and the graph records' recompute is left out as MFU leaves it.
2. Each stack's side: its registered formula on the config and the parameter groups.
3. A term per part: theirs - ours. Both sides' parts sum to their totals, so the terms sum
   to the difference exactly; a nonzero ``projections`` term flags a formula or a graph that
   does not run each weight once per token. A stack that multiplies a forward (DeepSpeed's
   profiler) is compared with the graph's forward by part and its backward as one part.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import InputError
from ..records import Report
from ..records.conventions import Conventions, StackCount, StackTerm
from ..training.per_batch import FlopsPerBatch
from ..training.throughput import DEFAULT_DTYPE, dense_peak
from . import dense, configured, deepspeed  # noqa: F401, I001  (registers their formulas, in this order)
from .parts import PARTS, graph_parts, param_groups
from .registry import STACKS, ModelFacts, NotCovered, StackFormula


def conventions(report_or_fpb: Report | FlopsPerBatch, batch: Any = None, *,
                config: Any = None, step_time_s: float | None = None,
                device: str | None = None, dtype: str = DEFAULT_DTYPE,
                peak_flop_per_s: float | None = None) -> Conventions:
    """The training FLOPs torchtitan, Megatron-LM, verl, TRL, Hugging Face's Trainer,
    DeepSpeed's profiler and PaLM's MFU definition would report for this step, beside the
    exact count, each difference split into named terms (`exportflops.stacks`).

    ``report_or_fpb``: a ``mode="train"`` `Report` of one batch, or a `FlopsPerBatch` with
    ``batch`` (a dict of the forward's keyword arguments, or a tuple of its positional ones).
    ``config``: the model's Hugging Face config, or the model (its ``config`` is read); the
    report does not carry it. DeepSpeed's profiler counts a forward run, so it needs the model
    (run on fake tensors, with the report's token ids, or the batch): with a bare config it
    is not covered. ``step_time_s`` with ``device`` (a key of the device table) or
    ``peak_flop_per_s``: the MFU each stack would log for that measured step, beside ours.
    """
    model = config if isinstance(config, torch.nn.Module) else None
    config = _config_of(config)
    report, graphs, ours, facts = _graph_side(report_or_fpb, batch, config, model)
    peak = None if step_time_s is None else dense_peak(
        peak_flop_per_s=peak_flop_per_s, device=device, dtype=dtype)
    rate = None if peak is None else (lambda flops: peak.throughput(flops, step_time_s).mfu)
    stacks = [_stack_count(formula, facts, graphs[formula.forward_multiple], ours, rate)
              for formula in STACKS.values()]
    return Conventions(model=report.model, model_type=str(config.model_type), rows=facts.rows,
                       seq=facts.seq, tokens=facts.real_tokens, graph_flops=ours,
                       graph_flops_per_token=ours / facts.real_tokens, stacks=stacks,
                       step_time_s=step_time_s,
                       peak_flop_per_s=None if peak is None else peak.flop_per_s,
                       peak_source="" if peak is None else peak.source,
                       graph_mfu=None if rate is None else rate(ours))


def _config_of(config: Any) -> Any:
    config = getattr(config, "config", config)  # a transformers model: its config
    if config is None or not hasattr(config, "model_type"):
        raise InputError("conventions() reads each stack's formula off the model's Hugging "
                         "Face config, which a report does not carry: pass config=model.config "
                         "(or config=model)")
    return config


def _graph_side(report_or_fpb, batch, config, model):
    """The report (at the batch's sizes), its parts (by ``backward_whole``, as
    `parts.graph_parts`), its count, and the facts of the batch."""
    if isinstance(report_or_fpb, FlopsPerBatch):
        return _batch_side(report_or_fpb, batch, config, model)
    report = report_or_fpb
    if batch is not None:
        raise InputError("conventions(report, batch): a report counts the one batch it was "
                         "analyzed with; pass a FlopsPerBatch to count another batch")
    if report.mode != "train" or not isinstance(report.total.flops, int):
        raise InputError(f"conventions() compares training steps: pass a mode='train' report "
                         f"with concrete sizes ({report.model} is mode={report.mode!r}"
                         f"{', symbolic: report.evaluate(...) first' if report.symbols else ''})")
    rows, seq = _ids_shape(report)
    graphs = {whole: graph_parts(report, whole) for whole in (False, True)}
    facts = ModelFacts(config, param_groups(report), rows, seq, (seq,) * rows, model,
                       _token_ids(model, rows, seq))
    return report, graphs, report.total.flops, facts


def _token_ids(model, rows: int, seq: int) -> dict[str, torch.Tensor] | None:
    """A report's batch for a forward run: token ids of its shape on the model's device
    (their values unread: the run makes them fake), as labels too when the forward takes
    them (the step the report counts has a loss)."""
    if model is None:
        return None
    device = next(model.parameters()).device
    ids = torch.zeros(rows, seq, dtype=torch.long, device=device)
    accepts = inspect.signature(model.forward).parameters
    return {"input_ids": ids, **({"labels": ids} if "labels" in accepts else {})}


def _batch_side(fpb: FlopsPerBatch, batch, config, model):
    if batch is None:
        raise InputError("conventions(fpb) needs the batch: conventions(fpb, batch), batch a "
                         "dict of the forward's keyword arguments or a tuple of positional ones")
    args, kwargs = ((), dict(batch)) if isinstance(batch, Mapping) else (tuple(batch), {})
    step = fpb.step(*args, **kwargs)
    sizes, rows = fpb.rows(*args, **kwargs)
    report = fpb.report.evaluate(**sizes)
    graphs = {whole: _executed(graph_parts(report, whole), step.model_flops)
              for whole in (False, True)}
    inputs = None if model is None else dict(
        inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments)
    facts = ModelFacts(config, param_groups(report), sizes[fpb.batch], sizes[fpb.seq],
                       tuple(sum(row) for row in rows), model, inputs)
    return report, graphs, step.model_flops, facts


def _executed(parts: dict[str, int], model_flops: int) -> dict[str, int]:
    """The parts of what runs, against ``model_flops``: recompute out, padding the rest."""
    executed = sum(parts.values()) - parts["recompute"]
    parts["recompute"] = 0  # model_flops leaves it out, as the stacks do
    parts["padding"] = model_flops - executed
    return parts


def _ids_shape(report: Report) -> tuple[int, int]:
    """(B, T) of the token ids: the first 2-d integer input."""
    for spec in report.inputs:
        if len(spec.shape) == 2 and spec.dtype.startswith(("int", "uint")):
            return spec.shape[0], spec.shape[1]
    raise InputError(f"{report.model}: no 2-d integer input (token ids) among the report's "
                     f"inputs; the stacks' formulas count tokens of a causal language model")


def _stack_count(formula: StackFormula, facts: ModelFacts, graph: dict[str, int], ours: int,
                 rate) -> StackCount:
    tokens = formula.tokens_of(facts)
    try:
        theirs = formula.parts(facts)
    except NotCovered as why:
        return StackCount(stack=formula.name, repository=formula.repository,
                          source=formula.source, covered=False,
                          reason=str(why), flops=None, tokens=tokens, flops_per_token=None,
                          difference_flops=None)
    flops = sum(theirs.values())
    terms = [StackTerm(part=part, theirs_flops=theirs.get(part, 0), ours_flops=graph[part],
                       difference_flops=theirs.get(part, 0) - graph[part], reason=reason)
             for part, reason in PARTS.items() if theirs.get(part, 0) or graph[part]]
    return StackCount(stack=formula.name, repository=formula.repository, source=formula.source,
                      covered=True, flops=flops,
                      tokens=tokens, flops_per_token=flops / tokens,
                      difference_flops=flops - ours, terms=terms,
                      mfu=None if rate is None else rate(flops))
