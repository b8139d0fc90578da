"""How counts, shares and seconds are written, and the one call to tabulate.

The only importer of tabulate in exportflops: every table, the budgets' comparison included, is
drawn by `table`, with its options passed per call (tabulate 0.10 ignores the global
``PRESERVE_WHITESPACE``, so the tree's indentation needs ``preserve_whitespace=True`` on each
call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
from tabulate import tabulate

from ..records import Report
from ..records.symbolic import size_symbol

# Decimal prefixes, largest first: counts and bytes are shown as k (1e3) to T (1e12).
_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_ALIGN = {"l": "left", "r": "right"}


def table(rows: list[list], headers: Sequence[str], align: str, *, tablefmt: str = "simple",
          maxcolwidths: list[int | None] | None = None) -> str:
    """One tabulate call; ``align`` is one letter per column, ``l`` or ``r``; ``maxcolwidths``
    wraps a column's text at that many characters (None: no wrapping). Cells are written as
    given: numbers are not reparsed, a missing cell is ``-``."""
    return tabulate(rows, headers=list(headers), tablefmt=tablefmt,
                    colalign=[_ALIGN[a] for a in align], maxcolwidths=maxcolwidths,
                    disable_numparse=True, preserve_whitespace=True, missingval="-")


@dataclass(frozen=True)
class Style:
    """How cells and headings are written; one value passed down to every view."""

    tablefmt: str = "simple"
    """tabulate's table format, passed to each call (``github`` for Markdown)."""
    as_string: bool = True
    """Human-readable units (``4.09 GMACs``, ``1.23 ms``); raw ints and seconds when False."""
    indent: str = "  "
    """One level of the tree's indentation (``&nbsp;&nbsp;`` in Markdown, where spaces collapse)."""
    heading: str = ""
    """Prefix of a view's title line (``## `` in Markdown)."""

    def count(self, value: int | float | sympy.Expr, unit: str = "") -> str | int | float:
        """``8.24 G``, ``4.09 GMACs``, ``25.56 M``: 2 decimals with a k/M/G/T prefix; a count of
        a dynamic size is written as its expression (``5514*batch``)."""
        if not self.as_string:
            return value if isinstance(value, (int, float)) else str(value)
        if not isinstance(value, (int, float)):
            return f"{value} {unit}" if unit else str(value)
        for scale, prefix in _PREFIXES:
            if abs(value) >= scale:
                return f"{value / scale:.2f} {prefix}{unit}"
        number = str(value) if isinstance(value, int) else f"{value:.2f}"
        return f"{number} {unit}" if unit else number

    def seconds(self, value: float | None) -> str | float | None:
        if value is None or not self.as_string:
            return value
        if value >= 1:
            return f"{value:.2f} s"
        if value >= 1e-3:
            return f"{value * 1e3:.2f} ms"
        return f"{value * 1e6:.2f} us"

    def percent(self, part: Any, whole: Any) -> str | float | None:
        """``part`` as a percentage of ``whole``; ``-`` when there is no whole, or when the share
        of two dynamic counts depends on the sizes."""
        share = constant(part / whole) if whole != 0 else None
        if share is None:
            return "-" if self.as_string else None
        return f"{100 * share:.2f}%" if self.as_string else round(100 * share, 2)

    def ratio(self, part: Any, whole: Any) -> str | float | None:
        """``part / whole`` to 3 decimals; ``-`` as for `percent`."""
        ratio = constant(part / whole) if whole != 0 else None
        if ratio is None:
            return "-" if self.as_string else None
        return f"{ratio:.3f}" if self.as_string else ratio

    def table(self, rows: list[list], headers: Sequence[str], align: str) -> str:
        return table(rows, headers, align, tablefmt=self.tablefmt)

    def titled(self, title: str, body: str) -> str:
        return f"{self.heading}{title}\n\n{body}" if self.heading else f"{title}\n{body}"


MARKDOWN = Style(tablefmt="github", indent="&nbsp;&nbsp;", heading="## ")


def constant(value: Any) -> float | None:
    """A number as a float; None for an expression that still depends on a dynamic size."""
    if isinstance(value, (int, float)):
        return float(value)
    value = sympy.cancel(value)
    return float(value) if value.is_number else None


def magnitude(report: Report) -> Callable[[Any], float]:
    """A count's value for ranking rows: itself, or for a count of dynamic sizes its value at the
    example sizes the graph was exported with. A count that still depends on a data-dependent
    size (one with no example) ranks as 0, last, rather than breaking the sort."""
    examples = {size_symbol(s.name): s.example for s in report.symbols if s.example is not None}

    def value_of(count: Any) -> float:
        if isinstance(count, (int, float)):
            return count
        value = count.xreplace(examples)
        return float(value) if value.is_number else 0.0
    return value_of
