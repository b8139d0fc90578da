"""The ``exportflops`` command: parse the flags (`options`), build MODEL (`targets`), call the
library's analyses, write their `Results` with `exportflops.outputs.to_format`. Exit status and
errors as docs/command.md says: 0, 2 (cannot run as written), 1 (building or analyzing failed),
each failure one paragraph on stderr (the traceback with ``--debug``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import traceback
import warnings
from functools import partial

# torch warns on import where numpy is missing ("Failed to initialize NumPy"): the command uses
# no numpy, so the warning would be the only thing on stderr. Scoped to the import.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # noqa: F401

from ..errors import BuildError, MissingExtraError, UsageError  # noqa: E402
from ..progress import Progress, showing, stage  # noqa: E402
from ..hf.memory import within_free_memory  # noqa: E402
from ..hf.models import import_transformers  # noqa: E402
from ..outputs import Results, to_format  # noqa: E402
from .options import check, parser  # noqa: E402
from .splits import check_split_sizes  # noqa: E402
from .targets import analyzed, built, dynamic_shapes, flagged, in_flags  # noqa: E402


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
    except (UsageError, FileNotFoundError) as error:  # a MODEL .pt2 that is not there
        return _fail(ns, f"exportflops: error: {error}", 2)
    except BuildError as error:
        return _fail(ns, f"exportflops: could not build {ns.model}: {error}", 1)
    except Exception as error:  # the CLI's boundary: any analysis failure becomes exit 1
        return _fail(ns, f"exportflops: analysis of {ns.model} failed: "
                         f"{type(error).__name__}: {error}", 1)
    if ns.trace:
        from ..render.trace import to_trace
        if not _written(ns, ns.trace, to_trace(outcome.report), "--trace"):
            return 2
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
    return 0 if _written(ns, ns.output, text, "--output", ", or leave --output out to print "
                                                           "the report") else 2


def _written(ns: argparse.Namespace, path: str, text: str, flag: str, more: str = "") -> bool:
    """``text`` written to ``path``, said on stderr; False (and why, on stderr) where it
    cannot be."""
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as error:
        _fail(ns, f"exportflops: error: cannot write {flag} {path!r} ({error.strerror}); pass a "
                  f"path in an existing, writable folder{more}.", 2)
        return False
    print(f"exportflops: wrote {path}", file=sys.stderr)
    return True


def _rendered(ns: argparse.Namespace, outcome: Results) -> tuple[str | None, Exception | None]:
    """The report's text (`outputs.to_format`), or why it could not be drawn: reported
    once the progress line is gone (`_fail` writes to the same terminal)."""
    try:
        return to_format(outcome, ns.format, ns.render_options), None
    except Exception as error:  # noqa: BLE001 - raised again by main, after the progress
        return None, error


def _analyze(ns: argparse.Namespace) -> Results:
    """`_analysis`; on --device cpu, capped at the memory the machine has free
    (`hf.memory.within_free_memory`), its refusal naming the flags."""
    if ns.device != "cpu":
        return _analysis(ns)
    with in_flags(), within_free_memory(ns.model):
        return _analysis(ns)


def _analysis(ns: argparse.Namespace) -> Results:
    from ..api import analyze

    if ns.model.endswith(".pt2"):  # a missing file: capture.saved.load's FileNotFoundError
        return _beside(ns, analyze(ns.model, strict=ns.strict, mode=ns.mode,
                                   split_backward=ns.split_backward))
    if ns.pp is not None or ns.cp is not None:
        check_split_sizes(ns)
    # A split's all-ranks view; with --memory, one rank's step, with --fit, its plan (below).
    if (ns.pp, ns.ep, ns.cp) != (None, None, None) and not ns.memory and ns.fit is None:
        from .ranks import analyze_split
        return analyze_split(ns)
    if ns.fit is not None:
        from .footprint import analyze_fit
        return Results(record=analyze_fit(ns))
    if ns.memory:
        from .footprint import analyze_memory
        return analyze_memory(ns)
    if ns.tp is not None or ns.fsdp is not None:
        from .ranks import analyze_parallelized
        report, reprs = analyze_parallelized(ns)
        return Results(report, extra_reprs=reprs)
    if ns.conventions and (ns.mode != "train" or not ns.model.startswith("hf:")):
        raise UsageError("--conventions compares training steps of a Hugging Face model: "
                         "pass --mode train and an hf: MODEL (its config holds the sizes).")
    model, args, kwargs = built(ns)
    if ns.generate is not None:
        from ..generation.decoder import analyze_generation
        if not args:  # the command's prompt is forward's first positional input
            raise UsageError(f"--generate analyzes a model that generates tokens from a prompt "
                             f"of token ids, and {type(model).__name__} takes its inputs by "
                             f"name ({', '.join(kwargs or {})}). Analyze its forward without "
                             f"--generate.")
        with flagged():  # a request the model cannot run: the message says why
            return Results(analyze_generation(model, args[0], new_tokens=ns.generate,
                                              cache=ns.cache, max_cache_len=ns.max_cache_len,
                                              full_logits=ns.full_logits, strict=ns.strict))
    if ns.seqlens is not None:
        from ..training import flops_per_batch
        from ..render.training import step_view
        fpb = flops_per_batch(model, args, kwargs, mode=ns.mode)
        return Results(record=fpb.step(seqlens=ns.seqlens),
                       view=partial(step_view, model=fpb.report.model))
    from ..attribution import extra_reprs

    reprs = extra_reprs(model)
    if ns.profile:
        from ..runtime.measure import profile
        return _beside(ns, profile(model, args, kwargs, warmup=ns.warmup, repeat=ns.repeat),
                       reprs)
    dynamic = None
    if ns.dims:
        maxima = {name: max(values) for name, values in ns.points.items()}
        dynamic = dynamic_shapes(ns, model, args, kwargs, maxima)
    report = analyzed(ns, model, args, kwargs, strict=ns.strict, mode=ns.mode,
                      dynamic_shapes=dynamic, fast=not ns.full_export,
                      split_backward=ns.split_backward)
    if ns.conventions:
        from ..stacks import conventions
        return Results(record=conventions(report, config=model))
    return _beside(ns, report, reprs, comparison=_comparison(ns, report, model, args))


def _comparison(ns: argparse.Namespace, report, model, args):
    """--budget's published budget of MODEL's config beside ``report``."""
    if not ns.budget:
        return None
    from ..budgets import compare
    from ..budgets.from_model import BUDGETS, config_of
    with flagged(f"--budget {ns.budget}"):
        config = config_of(model, args)
    return compare(report, BUDGETS[ns.budget](config))


def _beside(ns: argparse.Namespace, report, reprs: dict | None = None,
            comparison=None) -> Results:
    """``report`` with what the flags add beside it: --sweep's points, --device-model's
    roofline (at the example sizes, where the sizes are dynamic) and, on an HTML page, that
    device's roofs."""
    sweep = roofline = roofs = None
    if ns.points:
        try:
            sweep = report.sweep(**ns.points)
        except KeyError as error:  # a size the report has not (`Report.evaluate`)
            raise UsageError(f"--sweep: {error.args[0]}.") from error
    if ns.device_model is not None:
        from ..roofline import roofline as on_device
        roofline = on_device(report.evaluate() if report.symbols else report, ns.device_model)
    if ns.format == "html" and ns.device_model not in (None, "cpu"):
        from ..roofline.predict import device_roofs
        roofs = device_roofs(ns.device_model, report)
    return Results(report, sweep=sweep, points=ns.points, comparison=comparison,
                   roofline=roofline, roofs=roofs, extra_reprs=reprs)


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
