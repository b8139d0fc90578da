"""The pictures of a report: `to_html` (one self-contained page) and `to_trace` (a
Chrome/Perfetto trace of a measured report), each returned as text, as every rendering function
returns its text (write it with ``Path(...).write_text``).

The drawing needs no torch; ``to_html(report, device="h100-sxm")`` takes the roofs from
the device table (`exportflops.roofline.predict.device_roofs`), loaded only then.
"""

from __future__ import annotations


from ..errors import InputError
from ..records import MemoryReport, Report
from .html import html_report
from .plots import RooflineLike
from .trace import to_trace

__all__ = ["to_html", "to_trace"]


def to_html(report: Report | MemoryReport, *, device: str | None = None,
            roofline: RooflineLike | None = None) -> str:
    """The report as one HTML page that opens offline (needs ``pip install
    'exportflops[html]'``): the module tree sized by FLOPs and, when measured, by time; the
    nodes' arithmetic intensity against their achieved FLOP/s (or their FLOPs when the report
    was not measured); the module, node and operator tables, sortable.

    ``device`` is a key of the device table (``"h100-sxm"``, ``"a100-sxm-80gb"``, ...): its
    roofs are drawn (the table and torch load then). ``roofline`` is the report's roofline
    (``exportflops.roofline.roofline(report, device)``, or any value whose ``nodes`` carry
    ``name``, ``intensity``, ``bound`` and ``predicted_s``): each node's predicted rate is
    plotted beside the measured one, and its predicted time and bound are added to the node
    table.

    A `MemoryReport` (``exportflops.memory``) is drawn as its own page
    (`render.memory_html.memory_page`): its summary, the step's live bytes over time by kind,
    and its kinds and module tables; with ``device``, whether its peak fits that device.
    """
    if isinstance(report, MemoryReport):
        from .memory_html import memory_page

        if roofline is not None:
            raise InputError(f"to_html() of the memory of {report.model} takes no roofline: "
                             f"the roofline is a FLOPs report's.")
        return memory_page(report, fit=report.fits(device) if device is not None else None)
    peaks, bandwidth = None, None
    if device is not None:
        from ..roofline.predict import device_roofs

        peaks, bandwidth = device_roofs(device, report)
    return html_report(report, roofline=roofline, peaks=peaks, bandwidth_byte_per_s=bandwidth)
