"""The roofline of a report on one device: per node, per module and for the model, the time its
FLOPs and bytes predict, and whether compute or memory bounds it (`Report.roofline`).

Plain fields only (numbers and strings), so a picture or a trace can be drawn from the JSON.
"""

from __future__ import annotations

from typing import Literal

from .base import SCHEMA_VERSION, NotebookRecord, Record

Bound = Literal["compute", "memory"]


class _Predicted(Record):
    """Predicted and, when the report was profiled, measured time."""

    flops: int
    """FLOPs counted (all ops)."""
    bytes: int
    """Bytes moved: ``bytes_read + bytes_written``."""
    intensity: float | None
    """Arithmetic intensity, ``flops / bytes`` (None when no byte moves)."""
    compute_s: float
    """Time at the peak FLOP/s: FLOPs / peak (for a module, the sum over its nodes)."""
    memory_s: float
    """Time at the memory bandwidth: bytes / bandwidth (for a module, the sum over its nodes)."""
    predicted_s: float
    """``max(compute_s, memory_s)`` for a node; for a module the sum of its nodes' predictions
    (the ops run one after another)."""
    bound: Bound
    """``compute`` when the FLOPs take longer than the bytes (a node), or when the compute-bound
    nodes hold at least half of the predicted time (a module); else ``memory``."""
    measured_s: float | None = None
    """Measured median latency (`exportflops.profile`), None when not measured."""
    efficiency: float | None = None
    """``predicted_s / measured_s``: the share of the roof reached (None when not measured)."""


class RooflineNode(_Predicted):
    """One node of the graph under the roofline."""

    name: str
    """The node's name, as in `NodeRecord.name`."""
    op: str
    """The op, e.g. ``aten.linear.default``."""
    module: str
    """Path of the innermost module the node ran in."""
    dtype: str
    """The device table's dtype key whose peak the node runs at (``tf32``, ``bfloat16``, ...)."""
    peak_flop_per_s: float
    """That dense peak, FLOP/s."""
    ridge_point: float
    """``peak_flop_per_s / bandwidth``: the intensity (FLOPs per byte) above which the node is
    compute-bound."""


class RooflineModule(_Predicted):
    """A module (or the model, path ``""``) under the roofline: its nodes and its children's."""

    path: str
    """Module path as ``named_modules()`` names it; ``""`` is the model."""


class Roofline(NotebookRecord):
    """The roofline of one report on one device (`Report.roofline`)."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The report's model."""
    device: str
    """The table's device key, e.g. ``h100-sxm``, or ``cpu`` (measured here)."""
    source: str
    """Where the peaks and bandwidth come from: the datasheet row and its date, or the
    measurement on this CPU."""
    bandwidth_bytes_per_s: float
    """Memory bandwidth, bytes per second."""
    peak_flop_per_s: dict[str, float]
    """Dense peak FLOP/s per dtype key of the device."""
    tf32: bool
    """Whether float32 contractions were taken at the TF32 tensor-core peak."""
    nodes: list[RooflineNode]
    """Every node that moves bytes or does FLOPs, in graph order (views are left out)."""
    modules: list[RooflineModule]
    """Every module with at least one such node, parents before children."""
    total: RooflineModule
    """The whole model: ``total.predicted_s`` is its predicted time."""
    not_predicted: list[str] = []
    """Nodes with no count (uncounted, or their formula failed): missing from every time."""
    measured_on: str = ""
    """The device the measured times come from (``report.runtime.device``), when measured."""

    def _repr_html_(self) -> str:
        """What Jupyter shows: the roofs, the modules and slowest nodes, and a collapsible
        module tree of predicted times (plain HTML, no script)."""
        from ..render.notebook import roofline_html

        return roofline_html(self)
