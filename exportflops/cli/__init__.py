"""The ``exportflops`` command: parse arguments, build the model, analyze, render.

Orchestration only: counting is `analyze`'s, rendering is `render`'s. Exit status 0 on success,
2 when the command cannot run as written (bad arguments, a MODEL that does not resolve, a missing
file or package, a --device cpu run past the memory the machine has free), 1 when building or
analyzing the model fails; each failure prints one paragraph on stderr, and the traceback only
with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import traceback
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

# torch warns on import where numpy is missing ("Failed to initialize NumPy"): the command uses
# no numpy, so the warning would be the only thing on stderr. Scoped to the import.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # noqa: F401

from ..errors import BuildError, InputError, MissingExtraError, UsageError  # noqa: E402
from ..progress import Progress, showing, stage  # noqa: E402
from ..hf.memory import within_free_memory  # noqa: E402
from ..hf.models import import_transformers  # noqa: E402
from .options import check, parser  # noqa: E402
from .splits import check_split_sizes  # noqa: E402
from .targets import (  # noqa: E402
    analyzed, build_target, config_sizes, device_named, dynamic_shapes, hf_options, in_flags,
)


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    # Bound to the terminal before _quiet_torch takes stderr over; in a pipe or in CI only
    # with --progress.
    ns.progress = Progress(sys.stderr) if ns.progress or sys.stderr.isatty() else False
    try:
        with _quiet_torch(ns.debug), showing(ns.progress):
            check(ns)
            if ns.model.startswith("hf:"):
                stage("imports")  # transformers: a second or two, the first time
                import_transformers(ns.model.removeprefix("hf:"))
            stage("build")
            outcome = _analyze(ns)
            stage("render")
            text, unrendered = _rendered(ns, outcome)
    except UsageError as error:
        return _fail(ns, f"exportflops: error: {error}", 2)
    except BuildError as error:
        return _fail(ns, f"exportflops: could not build {ns.model}: {error}", 1)
    except Exception as error:  # the CLI's boundary: any analysis failure becomes exit 1
        return _fail(ns, f"exportflops: analysis of {ns.model} failed: "
                         f"{type(error).__name__}: {error}", 1)
    if ns.trace:
        from ..render.trace import to_trace
        try:
            with open(ns.trace, "w", encoding="utf-8") as file:
                file.write(to_trace(outcome.report))
        except OSError as error:
            return _fail(ns, f"exportflops: error: cannot write --trace {ns.trace!r} "
                             f"({error.strerror}); pass a path in an existing, writable "
                             f"folder.", 2)
        print(f"exportflops: wrote {ns.trace}", file=sys.stderr)
    try:
        if unrendered is not None:
            raise unrendered
    except MissingExtraError as error:  # a package to install: the command cannot run as is
        return _fail(ns, f"exportflops: error: {error}", 2)
    except Exception as error:  # the counts are fine; the view asked for could not be drawn
        return _fail(ns, f"exportflops: rendering the report of {ns.model} as {ns.format} "
                         f"failed: {type(error).__name__}: {error}", 1)
    if not ns.output:
        sys.stdout.write(text)
        return 0
    try:
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        return _fail(ns, f"exportflops: error: cannot write --output {ns.output!r} "
                         f"({error.strerror}); pass a path in an existing, writable folder, "
                         f"or leave --output out to print the report.", 2)
    print(f"exportflops: wrote {ns.output}", file=sys.stderr)
    return 0


def _rendered(ns: argparse.Namespace, outcome: _Outcome) -> tuple[str | None, Exception | None]:
    """The report's text, or why it could not be drawn: reported once the progress line is
    gone (`_fail` writes to the same terminal)."""
    try:
        return _render(ns, outcome), None
    except Exception as error:  # noqa: BLE001 - raised again by main, after the progress
        return None, error


@dataclass
class _Outcome:
    report: Any
    extra_reprs: dict | None
    """Each module's extra_repr() for the tree (None for a .pt2)."""
    sweep: list | None = None
    """The report evaluated at each --sweep point."""
    comparison: Any = None
    """The --budget comparison."""
    view: Any = None
    """An analysis with a record and a view of its own (--seqlens, --pp, --ep, --cp): (the
    record, a function of the record and a `render.Style` returning its text)."""
    roofline: Any = None
    """The --device-model roofline."""


def _analyze(ns: argparse.Namespace) -> _Outcome:
    """`_analysis`; on --device cpu, capped at the memory the machine has free
    (`hf.memory.within_free_memory`), its refusal naming the flags."""
    if ns.device != "cpu":
        return _analysis(ns)
    with in_flags(), within_free_memory(ns.model):
        return _analysis(ns)


def _analysis(ns: argparse.Namespace) -> _Outcome:
    from ..api import analyze

    if ns.model.endswith(".pt2"):
        if not os.path.isfile(ns.model):
            raise UsageError(f"no saved program at {ns.model!r}: pass the path of a file written "
                             f"by torch.export.save(program, path).")
        outcome = _Outcome(analyze(ns.model, strict=ns.strict, mode=ns.mode,
                                   split_backward=ns.split_backward), None)
        return _with_roofline(ns, _with_sweep(ns, outcome))
    if ns.pp is not None or ns.cp is not None:
        check_split_sizes(ns, **config_sizes(ns))
    # A split's all-ranks view; with --memory, one rank's step (below).
    if (ns.pp, ns.ep, ns.cp) != (None, None, None) and not ns.memory:
        from .ranks import analyze_split
        report, view = analyze_split(ns)
        return _Outcome(report, None, view=view)
    if ns.fit is not None:
        from .planner import analyze_fit
        return _Outcome(None, None, view=analyze_fit(ns))
    if ns.memory:
        from .footprint import analyze_memory
        return _Outcome(None, None, view=analyze_memory(ns))
    if ns.tp is not None or ns.fsdp is not None:
        from .ranks import analyze_parallelized
        return _Outcome(*analyze_parallelized(ns))
    if ns.conventions and (ns.mode != "train" or not ns.model.startswith("hf:")):
        raise UsageError("--conventions compares training steps of a Hugging Face model: "
                         "pass --mode train and an hf: MODEL (its config holds the sizes).")
    model, args, kwargs = build_target(ns.model, device_named(ns.device or "meta"),
                                       shapes=ns.shapes, kwargs=ns.kwargs,
                                       hf_options=hf_options(ns))
    if ns.generate is not None:
        from ..generation.decoder import analyze_generation
        if not args:  # the command's prompt is forward's first positional input
            raise UsageError(f"--generate analyzes a model that generates tokens from a prompt "
                             f"of token ids, and {type(model).__name__} takes its inputs by "
                             f"name ({', '.join(kwargs or {})}). Analyze its forward without "
                             f"--generate.")
        try:
            return _Outcome(analyze_generation(model, args[0], new_tokens=ns.generate,
                                               cache=ns.cache, max_cache_len=ns.max_cache_len,
                                               full_logits=ns.full_logits,
                                               strict=ns.strict), None)
        except InputError as error:  # a request the model cannot run: the message says why
            raise UsageError(str(error)) from error
    if ns.seqlens is not None:
        from ..training import flops_per_batch
        from ..render.training import step_view
        fpb = flops_per_batch(model, args, kwargs, mode=ns.mode)
        return _Outcome(fpb.report, None, view=(fpb.step(seqlens=ns.seqlens),
                                                partial(step_view, model=fpb.report.model)))
    from ..attribution import extra_reprs

    reprs = extra_reprs(model)
    if ns.profile:
        from ..runtime.measure import profile
        report = profile(model, args, kwargs, warmup=ns.warmup, repeat=ns.repeat)
        return _with_roofline(ns, _Outcome(report, reprs))
    dynamic = None
    if ns.dims:
        maxima = {name: max(values) for name, values in ns.points.items()}
        dynamic = dynamic_shapes(ns, model, args, kwargs, maxima)
    report = analyzed(ns, model, args, kwargs, strict=ns.strict, mode=ns.mode,
                      dynamic_shapes=dynamic, fast=not ns.full_export,
                      split_backward=ns.split_backward)
    outcome = _Outcome(report, reprs)
    if ns.conventions:
        from ..render.conventions import conventions_view
        from ..stacks import conventions
        outcome.view = (conventions(report, config=model), conventions_view)
    if ns.budget:
        from ..budgets import compare
        from ..budgets.from_model import BUDGETS, config_of
        try:
            config = config_of(model, args)
        except InputError as error:
            raise UsageError(f"--budget {ns.budget}: {error}") from error
        outcome.comparison = compare(report, BUDGETS[ns.budget](config))
    return _with_roofline(ns, _with_sweep(ns, outcome))


def _with_roofline(ns: argparse.Namespace, outcome: _Outcome) -> _Outcome:
    if ns.device_model is not None:
        from ..roofline import roofline

        report = outcome.report
        if report.symbols:  # dynamic sizes: the roofline at the example sizes
            report = report.evaluate()
        outcome.roofline = roofline(report, ns.device_model)
    return outcome


def _with_sweep(ns: argparse.Namespace, outcome: _Outcome) -> _Outcome:
    if ns.points:
        try:
            outcome.sweep = outcome.report.sweep(**ns.points)
        except KeyError as error:  # a size the report has not (`Report.evaluate`)
            raise UsageError(f"--sweep: {error.args[0]}.") from error
    return outcome


@contextlib.contextmanager
def _quiet_torch(debug: bool):
    """Without --debug, hide what torch writes to stderr while exporting: its logged warnings
    (guards, unbacked symbols) and the partial graph torch.export prints on a failure. The
    failure itself is reported once, as one paragraph, by _fail."""
    if debug:
        yield
        return
    # torch's child loggers carry levels and handlers of their own (their "E..." lines are
    # errors): only disabling logging as a whole keeps them all quiet.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _render(ns: argparse.Namespace, outcome: _Outcome) -> str:
    from ..render import RenderOptions, flops_report, sweep_view, to_csv, to_markdown

    report = outcome.report
    if outcome.view is not None:
        from ..render import MARKDOWN, Style
        record, view = outcome.view
        if ns.format == "json":
            return record.model_dump_json(indent=2) + "\n"
        if ns.format == "html" and ns.memory:
            from .footprint import memory_html
            return memory_html(record)
        if ns.format == "html":  # --pp, --ep, --cp: a bar per rank (and the timeline)
            from ..render.html import parallel_page
            return parallel_page(record, view=view)
        return view(record, style=MARKDOWN if ns.format == "md" else Style())
    if ns.format == "json":
        if outcome.roofline is not None:
            return json.dumps({"report": report.model_dump(mode="json"),
                               "roofline": outcome.roofline.model_dump(mode="json")},
                              indent=2) + "\n"
        if outcome.sweep is not None:
            return json.dumps([r.model_dump(mode="json") for r in outcome.sweep], indent=2) + "\n"
        if outcome.comparison is not None:
            return json.dumps({"report": report.model_dump(mode="json"),
                               "comparison": outcome.comparison.model_dump(mode="json")},
                              indent=2) + "\n"
        return report.model_dump_json(indent=2) + "\n"
    if ns.format == "html":
        return _html(ns, outcome)
    if outcome.sweep is not None:
        tablefmt = {"md": "github", "csv": "csv"}.get(ns.format, "simple")
        return sweep_view(outcome.sweep, ns.points, tablefmt) + "\n"
    if ns.format == "csv":
        return to_csv(report, rows="operators" if ns.views == ["operators"] else "modules")
    link = None if ns.link_gbps is None else ns.link_gbps * 1e9
    options = RenderOptions(view=ns.views, depth=ns.depth, top=ns.top, group_by=ns.group_by,
                            extra_reprs=outcome.extra_reprs, link_bytes_per_s=link)
    text = (to_markdown if ns.format == "md" else flops_report)(report, options)
    if outcome.comparison is not None:
        from ..budgets import comparison_table
        tablefmt = "github" if ns.format == "md" else "simple"
        text += "\n" + comparison_table(outcome.comparison, tablefmt=tablefmt) + "\n"
    if outcome.roofline is not None:
        from ..render import MARKDOWN, Style, roofline_view
        style = MARKDOWN if ns.format == "md" else Style()
        text += "\n" + roofline_view(outcome.roofline, style, depth=ns.depth, top=ns.top)
    return text


def _html(ns: argparse.Namespace, outcome: _Outcome) -> str:
    """The page; with --device-model its roofline and (for a table row) the device's roofs."""
    from ..render.html import html_report

    peaks = bandwidth = None
    if ns.device_model not in (None, "cpu"):
        from ..roofline.predict import device_roofs
        peaks, bandwidth = device_roofs(ns.device_model, outcome.report)
    return html_report(outcome.report, roofline=outcome.roofline, peaks=peaks,
                       bandwidth_byte_per_s=bandwidth)


def _fail(ns: argparse.Namespace, message: str, code: int) -> int:
    """Print one paragraph on stderr: the message up to its first blank line (torch's errors run
    on for pages; the traceback, with the whole message, is --debug's)."""
    paragraph = " ".join(message.strip().split("\n\n")[0].split())
    if ns.debug:
        traceback.print_exc()
    elif code == 1:
        paragraph += " (--debug shows the traceback and the whole message)"
    print(paragraph, file=sys.stderr)
    return code
