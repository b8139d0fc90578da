"""The pipeline view (`PipelineReport`): each stage's work and sends per microbatch, then each
rank's share of the step under the schedule, its bubble, and the rank that sets the step.

Pure: reads the record only; every number shown is a field of it or a sum of fields.
"""

from __future__ import annotations

from ..records.pipeline import PipelineReport, PipelineStage
from .format import Style


def pipeline_view(record: PipelineReport, style: Style = Style(), *, rank: int | None = None,
                  ) -> str:
    """The stage table, the rank table and the step's line; ``rank`` marks that rank's rows."""
    unit = "unit times (1 s per action)" if record.device == "unit" else \
        f"{'measured' if record.times == 'measured' else 'roofline'} on {record.device}"
    mesh = record.tp * record.fsdp > 1
    stage_rows = []
    for s in record.stages:
        sent = {phase: sum(c.bytes for c in s.sends if c.phase == phase)
                for phase in ("forward", "backward")}
        stage_rows.append([
            s.index, _marked(s.rank, rank), _modules(s.modules), style.count(s.params),
            style.count(s.forward.flops), style.count(s.backward.flops),
            _time(s.forward_s, record, style, s.forward_collectives_s)
            + (f"; gather {style.seconds(s.unshard_s)} per step" if s.unshard_s else ""),
            _backward_time(s, record, style) if record.mode == "train" else "-",
            style.count(sent["forward"], "B"), style.count(sent["backward"], "B"),
            *([_ranks(s.stands_for), style.count(sum(c.bytes for c in s.collectives), "B")]
              if mesh else [])])
    headers = ["stage", "rank", "holds", "params", "forward FLOPs", "backward FLOPs",
               "forward time", "backward time", "sends forward", "sends backward"]
    title = (f"{record.model}: {len(record.stages)} pipeline stages on {record.pp} ranks, per "
             f"microbatch ({record.mode}; times: {unit})")
    shared = [s for s in record.stages if s.counted_as not in (None, s.index)]
    if shared:
        title += "; " + ", ".join(f"stage {s.index} does stage {s.counted_as}'s work"
                                  for s in shared) + " (alike calls, counted once)"
    if mesh:  # each stage's row is one rank of its (fsdp, tp) group, standing for all of it
        headers += ["global ranks", "tp/fsdp collectives"]
        title += (f"; each stage on fsdp {record.fsdp} x tp {record.tp} ranks, one analyzed "
                  f"for all of its {record.fsdp * record.tp} ({record.world_size()} ranks in "
                  f"all), params and work per rank")
    stages = style.titled(title, style.table(stage_rows, headers, "rrlrrrrrrr" + "lr" * mesh))
    rank_rows = [[_marked(r.rank, rank), ", ".join(map(str, r.stages)), _time(r.busy_s, record,
                  style), _time(r.end_s, record, style),
                  style.percent(r.bubble_fraction, 1)] for r in record.ranks]
    ranks = style.titled(
        f"Schedule {record.schedule} (torch's {record.torch_schedule}), {record.microbatches} "
        f"microbatches, {record.stages_per_rank} stage(s) per rank",
        style.table(rank_rows, ["rank", "stages", "busy", "last action ends", "bubble"],
                    "rlrrr"))
    slowest = record.ranks[record.slowest_rank].stages[0]
    setters = f" (global ranks {_ranks(record.stages[slowest].stands_for)})" if mesh else ""
    step = (f"Step: {_time(record.step_time_s, record, style)}, set by rank "
            f"{record.slowest_rank}{setters}; bubble "
            f"{style.percent(record.bubble_fraction, 1)} of all ranks' time.")
    timer = f"\nMeasured: {record.timer}.\n" if record.timer else ""
    return f"{stages}\n\n{ranks}\n\n{step}\n{timer}"


def _time(value: float, record: PipelineReport, style: Style, collectives_s: float = 0.0):
    """A time as the record counts it, and a stage's collectives' on the link after a ``+``."""
    if record.device == "unit":
        return f"{value:g} units"
    spent = f" + {style.seconds(collectives_s)} collectives" if collectives_s else ""
    return f"{style.seconds(value)}{spent}"


def _backward_time(stage: PipelineStage, record: PipelineReport, style: Style) -> str:
    """A stage's backward time; with a schedule that splits it, its input and weight passes',
    and its whole backward's where the schedule also runs it (DualPipeV) and it differs."""
    reduce = (f"; reduce {style.seconds(stage.reduce_grad_s)} per step"
              if stage.reduce_grad_s else "")
    if stage.backward_input_s is None:
        return _time(stage.backward_s, record, style, stage.backward_collectives_s) + reduce
    input_pass = _time(stage.backward_input_s, record, style,
                       stage.backward_input_collectives_s)
    weight_pass = _time(stage.backward_weight_s, record, style,
                        stage.backward_weight_collectives_s)
    passes = f"I {input_pass}, W {weight_pass}"
    if stage.backward_s == stage.backward_input_s + stage.backward_weight_s:
        return passes + reduce
    whole = _time(stage.backward_s, record, style, stage.backward_collectives_s)
    return f"{passes}; whole {whole}{reduce}"


def _ranks(ranks: list[int]) -> str:
    """``4-7``: a stage's global ranks, consecutive on the mesh (tp innermost)."""
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else ", ".join(map(str, ranks))


def _marked(value: int, rank: int | None) -> str:
    return f"{value} *" if value == rank else str(value)


def _modules(paths: list[str]) -> str:
    """``tok_embeddings, layers.0-1``: consecutive numbered siblings as one range."""
    parts: list[str] = []
    run: tuple[str, int, int] | None = None
    for path in paths:
        stem, _, last = path.rpartition(".")
        if last.isdigit() and run and run[0] == stem and run[2] + 1 == int(last):
            run = (stem, run[1], int(last))
            continue
        if run:
            parts.append(_run(run))
            run = None
        if last.isdigit():
            run = (stem, int(last), int(last))
        else:
            parts.append(path)
    if run:
        parts.append(_run(run))
    return ", ".join(parts)


def _run(run: tuple[str, int, int]) -> str:
    stem, first, last = run
    prefix = f"{stem}." if stem else ""
    return f"{prefix}{first}" if first == last else f"{prefix}{first}-{last}"
