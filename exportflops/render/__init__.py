"""Report -> text tables, CSV and Markdown; imports no torch, so a saved JSON report renders
without the model.

Every view is a pure function of a `Report` and the display options: it reads the totals the
report holds and never recomputes one, so a printed total is the report's own. Counts of dynamic
sizes are written as their expressions and ranked at the sizes the graph was exported with.
Percentages are of the model's totals (``report.total``, ``report.params``). `flops_report` joins
views. Every rendering function returns its text (`flops_report`, `to_csv`, `to_markdown`,
`roofline_view`, and `exportflops.render.pictures`' `to_html` and `to_trace`): none prints or
writes a file; write the text with ``Path(...).write_text``.

Views, after DeepSpeed's flops profiler and fvcore:

- ``summary``: params, MACs, FLOPs (all ops and matmul family), bytes, coverage, and the
  measured latency, achieved FLOP/s and MFU when ``report.runtime`` is set;
- ``top``: for each depth, the top-k module types (or paths) by params, MACs, FLOPs and latency
  (DeepSpeed's "aggregated profile");
- ``tree``: every module, inclusive of its children, with the ops it runs itself (its
  functionals) and repeated identical siblings collapsed (DeepSpeed's "detailed profile");
- ``operators``: cost per op (fvcore's ``by_operator``), with the model total as the last row;
- ``module_operators``: inclusive cost per module and op (fvcore's ``by_module_and_operator``);
- ``collectives``: a parallelized model's rank, each collective it issues with its nccl-tests
  message size and bus-bandwidth factor, and its time at ``link_bytes_per_s`` when given.

Files: ``format.py`` (how numbers are written; the one call to tabulate), ``tree.py`` (tree,
top), ``tables.py`` (summary, operators, module_operators, CSV), ``collectives.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..records import GenerationReport, Report
from ..records.collectives import check_link
from .collectives import collectives_view
from .format import MARKDOWN, Style
from .roofline import roofline_view
from .generation import generation_view
from .tables import (module_operators_view, operators_view, require_report, summary_view,
                     sweep_view, to_csv)
from .tree import top_view, tree_view

VIEWS: tuple[str, ...] = ("summary", "top", "tree", "operators", "module_operators",
                          "collectives")
DEFAULT_VIEWS: tuple[str, ...] = ("summary", "top", "tree")


class RenderOptions(BaseModel):
    """What the views show and how: one value for `render`, `flops_report` and `to_markdown`,
    which also take its fields as keywords."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    view: tuple[str, ...] = DEFAULT_VIEWS
    """The views, in this order: one name or several of ``summary``, ``top``, ``tree``,
    ``operators``, ``module_operators``, ``collectives``."""
    depth: int = Field(-1, ge=-1)
    """Deepest module level shown in the tree, top and module_operators views (-1: all)."""
    top: int = Field(3, ge=-1)
    """Module types (or paths) shown per depth in the top view (-1: all)."""
    group_by: Literal["type", "path"] = "type"
    """The top view ranks module types (class names) or module paths."""
    collapse: bool = True
    """The tree shows a run of identical numbered siblings as one row, summed over the run."""
    ignore_modules: tuple[str, ...] = ()
    """Module types (class names, short or qualified) left out of the module views with
    everything under them; the totals stay the model's."""
    extra_reprs: dict[str, str] | None = None
    """Module path -> its ``extra_repr()``, shown in a last column of the tree."""
    tablefmt: str = "simple"
    """tabulate's table format; `to_markdown` writes ``github`` and takes no other."""
    as_string: bool = True
    """Human-readable units (``4.09 GMACs``, ``1.23 ms``); raw integers and seconds when
    False."""
    link_bytes_per_s: float | None = None
    """Bus bandwidth of the link between ranks, bytes/s: the collectives view adds each one's
    estimated time (message bytes x bandwidth factor / this). None: no times."""

    @field_validator("link_bytes_per_s")
    @classmethod
    def _a_bandwidth(cls, link_bytes_per_s: float | None) -> float | None:
        if link_bytes_per_s is not None:
            check_link(link_bytes_per_s)
        return link_bytes_per_s

    @field_validator("view", mode="before")
    @classmethod
    def _known_views(cls, view: Any) -> tuple:
        names = (view,) if isinstance(view, str) else tuple(view)
        for name in names:
            if name not in VIEWS:
                raise ValueError(f"unknown view {name!r}; choose from {', '.join(VIEWS)}")
        return names

    @field_validator("group_by", mode="before")
    @classmethod
    def _known_grouping(cls, group_by: Any) -> Any:
        if group_by not in ("type", "path"):
            raise ValueError(f"group_by must be 'type' or 'path', got {group_by!r}")
        return group_by


def render(report: Report, options: RenderOptions = RenderOptions(),
           style: Style | None = None) -> str:
    """The views named in ``options.view``, in that order, separated by a blank line; ``style``
    defaults to plain text in ``options.tablefmt``."""
    require_report(report, "render")
    o = options
    style = style or Style(tablefmt=o.tablefmt, as_string=o.as_string)
    views = {
        "summary": lambda: summary_view(report, style),
        "top": lambda: top_view(report, style, top=o.top, depth=o.depth, group_by=o.group_by,
                                ignore_modules=o.ignore_modules),
        "tree": lambda: tree_view(report, style, depth=o.depth, collapse=o.collapse,
                                  ignore_modules=o.ignore_modules, extra_reprs=o.extra_reprs),
        "operators": lambda: operators_view(report, style),
        "module_operators": lambda: module_operators_view(report, style, depth=o.depth,
                                                          ignore_modules=o.ignore_modules),
        "collectives": lambda: collectives_view(report, style,
                                                link_bytes_per_s=o.link_bytes_per_s),
    }
    return "\n\n".join(views[name]() for name in o.view) + "\n"


def flops_report(report: Report, options: RenderOptions | None = None, **fields: Any) -> str:
    """The report as text tables, DeepSpeed-profiler style; returns the text.

    ``options`` (a `RenderOptions`), or its fields as keywords (they override ``options``):
    ``view`` one or more of ``summary``, ``top``, ``tree``, ``operators``,
    ``module_operators``, ``collectives``; ``depth``, ``top``, ``group_by``, ``collapse``,
    ``ignore_modules``, ``extra_reprs``, ``tablefmt``, ``as_string``, ``link_bytes_per_s`` (see
    `RenderOptions`). A `GenerationReport` renders as its per-token table (``tablefmt`` and
    ``as_string`` apply).
    """
    options = _options(options, fields, "flops_report")
    if isinstance(report, GenerationReport):
        text = generation_view(report, Style(tablefmt=options.tablefmt,
                                             as_string=options.as_string)) + "\n"
    else:
        text = render(report, options)
    return text


def to_markdown(report: Report, options: RenderOptions | None = None, **fields: Any) -> str:
    """The same views as GitHub Markdown: a title, then a ``##`` section and table per view.
    Takes the options as `flops_report` does; ``tablefmt`` is always ``github``."""
    require_report(report, "to_markdown")
    options = _options(options, fields, "to_markdown")
    if options.tablefmt not in (RenderOptions.model_fields["tablefmt"].default,
                                MARKDOWN.tablefmt):
        raise ValueError(f"to_markdown writes GitHub tables, not tablefmt="
                         f"{options.tablefmt!r}: use flops_report for other formats.")
    style = dataclasses.replace(MARKDOWN, as_string=options.as_string)
    return f"# exportflops report: {report.model}\n\n{render(report, options, style)}"


def _options(options: RenderOptions | None, fields: dict[str, Any],
             caller: str) -> RenderOptions:
    """The one place keyword options become a `RenderOptions`: ``fields`` over ``options``."""
    if options is not None and not isinstance(options, RenderOptions):
        raise TypeError(f"{caller}()'s second argument is a RenderOptions, got "
                        f"{type(options).__qualname__}: pass the options as keywords, e.g. "
                        f"{caller}(report, view='tree').")
    unknown = sorted(set(fields) - set(RenderOptions.model_fields))
    if unknown:
        raise TypeError(f"{caller}() got unknown keyword(s) {', '.join(unknown)}; it takes "
                        f"{', '.join(RenderOptions.model_fields)}.")
    if options is None:
        return RenderOptions(**fields)
    return RenderOptions(**{**dict(options), **fields}) if fields else options


__all__ = ["DEFAULT_VIEWS", "VIEWS", "RenderOptions", "Style", "collectives_view", "flops_report",
           "generation_view",
           "render", "roofline_view", "sweep_view", "to_csv", "to_markdown"]
