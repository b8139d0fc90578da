"""The pictures of a report as files: `to_html` (one self-contained page) and `to_trace` (a
Chrome/Perfetto trace of a measured report).

The drawing is `exportflops.render`'s and needs no torch; what this module adds is the device:
``to_html(report, path, device="h100-sxm")`` takes the roofs from the table of
`exportflops.roofline.devices`, whose rows are looked up by key here.
"""

from __future__ import annotations

import os

import torch

from ..roofline import devices
from ..errors import UnknownDeviceError
from ..records import Report
from .html import write_html
from .plots import RooflineLike
from .trace import to_trace

__all__ = ["device_roofs", "to_html", "to_trace"]


def to_html(report: Report, path: str | os.PathLike, *, device: str | None = None,
            roofline: RooflineLike | None = None) -> None:
    """Write the report as one HTML page that opens offline (needs ``pip install
    'exportflops[html]'``): the module tree sized by FLOPs and, when measured, by time; the
    nodes' arithmetic intensity against their achieved FLOP/s (or their FLOPs when the report
    was not measured); the module, node and operator tables, sortable.

    ``device`` is a key of the device table (``"h100-sxm"``, ``"a100-sxm-80gb"``, ...): its
    roofs are
    drawn. ``roofline`` is the report's roofline (``report.roofline(device=...)``, or any value
    whose ``nodes`` carry ``name``, ``intensity``, ``bound`` and ``predicted_s``): each node's
    predicted rate is plotted beside the measured one, and its predicted time and bound are
    added to the node table.
    """
    peaks, bandwidth = device_roofs(device, report) if device is not None else (None, None)
    write_html(report, path, roofline=roofline, peaks=peaks, bandwidth_byte_per_s=bandwidth)


def device_roofs(key: str, report: Report) -> tuple[dict[str, float], float]:
    """The roofs of the table row ``key`` for ``report``: its dense peak in the dtype that does
    most of the report's contractions (`devices.compute_dtype`; float32 as TF32 unless torch's
    float32 matmul precision is ``"highest"``, as `devices.mfu_peak` has it), and its memory
    bandwidth in bytes/s (the memory roof)."""
    row = devices.device_row(key)
    tf32 = torch.get_float32_matmul_precision() != "highest"
    dtype = devices.matmul_dtype(devices.compute_dtype(report), tf32=tf32)
    if dtype not in row.dense_tflops:
        raise UnknownDeviceError(f"The table has no dense {dtype} peak for {key} (it lists "
                                 f"{', '.join(row.dense_tflops)}): no compute roof to draw.")
    tflops = row.dense_tflops[dtype]
    peaks = {f"{key} {dtype} dense {tflops:g} TFLOP/s": tflops * devices.TERA}
    return peaks, row.bandwidth_bytes_per_s
