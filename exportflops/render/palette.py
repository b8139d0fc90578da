"""One palette and one style for every picture: the HTML page's plotly figures
(`exportflops.render.plots`) and the notebooks' matplotlib ones, with ticks written as the
tables write counts.

Plain data and pure functions (no plotting package imported): a notebook passes
`matplotlib_style()` to ``matplotlib.pyplot.rc_context`` (or ``rcParams.update``) and
`tick_label` to an axis' ``set_major_formatter``.
"""

from __future__ import annotations

from collections.abc import Callable

from .format import Style

#: plotly's default qualitative colorway (``plotly.colors.qualitative.Plotly``), the colors
#: the HTML page's figures are drawn in: the notebooks draw in the same order.
PALETTE: tuple[str, ...] = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3",
                            "#FF6692", "#B6E880", "#FF97FF", "#FECB52")

#: What a color stands for wherever it is drawn, so that a reader learns it once.
COLORS: dict[str, str] = {
    "flops": PALETTE[0],
    "bytes": PALETTE[1],
    "forward": PALETTE[2],
    "backward": PALETTE[3],
    "backward_input": PALETTE[6],  # apart from a whole backward: DualPipeV runs both
    "backward_weight": PALETTE[8],
    "unshard": PALETTE[7],
    "reduce_grad": PALETTE[9],
    "budget": PALETTE[4],
    "kv_cache": PALETTE[5],
}

_TICKS = Style()


def matplotlib_style() -> dict[str, object]:
    """matplotlib rcParams of the pictures: the palette as the color cycle, plotly's light grid
    and its sans-serif type, no top or right spine."""
    colors = ", ".join(repr(c) for c in PALETTE)
    return {
        "axes.prop_cycle": f"cycler('color', [{colors}])",
        "axes.grid": True,
        "axes.axisbelow": True,
        "grid.color": "#E5ECF6",
        "axes.edgecolor": "#444444",
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.titlesize": 11,
        "axes.labelsize": 10,
        "font.family": "sans-serif",
        "figure.dpi": 80,
        "figure.figsize": (6.4, 3.6),
        "savefig.bbox": "tight",
    }


def tick_label(unit: str = "") -> Callable[[float, int], str]:
    """A tick formatter writing a value as the tables do: ``8.24 G``, ``1.02 kB`` (``unit`` is
    appended after the prefix, ``B``, ``FLOP/s``...)."""
    def label(value: float, position: int) -> str:
        number = int(value) if float(value).is_integer() else value
        return str(_TICKS.count(number, unit))
    return label
