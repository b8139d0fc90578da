"""The seconds of a pipeline stage's actions on one microbatch, keyed as torch's actions
(``F``, ``B``, with the backward in two passes ``I`` and ``W``; FSDP2's once-per-step ``U``
and ``R``): its ops' on the roofline's device (`action_times`) and its own collectives' on
the link (`collective_seconds`), what `exportflops.parallel.pipeline.analysis.count_pipeline`
lays out on the timeline.
"""

from __future__ import annotations

from ...records import Collective, Report


def action_times(report: Report, device: str | None, two_passes: bool,
                 whole: Report | None = None) -> dict[str, float]:
    """Seconds of each of a stage's actions on one microbatch, keyed as torch's actions: ``F``
    and ``B`` (the whole backward), with ``two_passes`` its input and weight passes ``I`` and
    ``W`` too, ``B`` then the backward of ``whole`` (the stage counted with its backward whole)
    or else the two passes'; the roofline's sums of its nodes on ``device``, or one unit per
    action (None), a whole backward two where the schedule splits it."""
    train = report.mode == "train"
    if device is None:  # a whole backward is its two passes where the schedule splits it
        units = {"F": 1.0, "B": (2.0 if two_passes else 1.0) if train else 0.0}
        return {**units, "I": 1.0, "W": 1.0} if two_passes else units
    from ...roofline import roofline

    action = {node.name: "F" if node.phase == "forward" else
              {"input": "I", "weight": "W"}.get(node.gradient, "B") for node in report.nodes}
    spent = dict.fromkeys("FBIW", 0.0)
    for node in roofline(report, device).nodes:
        spent[action[node.name]] += node.predicted_s
    if not two_passes:
        return {"F": spent["F"], "B": spent["B"]}
    if whole is None:
        return {**spent, "B": spent["I"] + spent["W"]}
    backward = {node.name for node in whole.nodes if node.phase == "backward"}
    return {**spent, "B": sum(node.predicted_s for node in roofline(whole, device).nodes
                              if node.name in backward)}


def collective_seconds(collectives: list[Collective], mode: str, link_bytes_per_s: float,
                       gather_once: bool) -> dict[str, float]:
    """The seconds a stage's own ``collectives`` take in each of its actions on the link: its
    forward's in ``F``, its backward's in ``B``, and with the backward in two passes each
    pass's in ``I`` and ``W``. FSDP2's (c10d's in-place ops: tensor parallelism's are
    functional) run once per step (`with_step_actions`): the reduce-scatters of its gradients
    in ``R``, and with ``gather_once`` in training its parameters' all-gathers in ``U`` when
    the backward gathers none again (they stay gathered after the forward: torchtitan's
    ``reshard_after_forward=False`` under pipelining, and pipelining keeps them through each
    backward). In a forward-only count, where the backward gathers again, or where a rank
    holds more stages than torch keeps gathered, each forward gathers (an upper bound)."""
    spent = dict.fromkeys("FBIWUR", 0.0)
    fsdp = [c for c in collectives if c.torch_op.startswith("c10d.")]
    kept = gather_once and mode == "train" and not any(
        c.op == "all_gather" and c.phase == "backward" for c in fsdp)
    for c in collectives:
        seconds = c.seconds(link_bytes_per_s)
        if c in fsdp and c.op == "all_gather" and kept:
            spent["U"] += seconds
        elif c.phase == "forward":
            spent["F"] += seconds
        elif c in fsdp and c.op == "reduce_scatter":
            spent["R"] += seconds
        else:
            spent["B"] += seconds
            if c.gradient:
                spent["I" if c.gradient == "input" else "W"] += seconds
    return spent
