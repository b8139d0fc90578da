"""The exceptions exportflops raises; each message names what failed and what to do next."""

from __future__ import annotations

import importlib
from types import ModuleType


class ExportFlopsError(Exception):
    """Base class of every error raised by exportflops."""


class TorchFeatureError(ExportFlopsError):
    """The installed torch lacks a private API an analysis needs (torch moves them between
    releases): names the feature, the analysis, and the releases the suite runs on."""

    def __init__(self, feature: str, path: str, needed_by: str, version: str,
                 tested: tuple[str, ...]) -> None:
        self.feature, self.path, self.needed_by = feature, path, needed_by
        super().__init__(
            f"{needed_by} needs {path} ({feature}), which torch {version} does not have. "
            f"torch {', '.join(tested)} have it (the releases exportflops is tested on): "
            f"install one of them, e.g. pip install torch=={tested[-1]}."
        )


class ExportError(ExportFlopsError):
    """``torch.export`` could not capture the model.

    Carries torch's own message (``torch_message``) and a hint for the user's next step.
    """

    def __init__(self, model_name: str, torch_message: str, hint: str) -> None:
        self.model_name = model_name
        self.torch_message = torch_message
        self.hint = hint
        super().__init__(
            f"torch.export could not capture {model_name}.\n"
            f"Hint: {hint}\n"
            f"torch said: {torch_message}"
        )


class UncountedOpError(ExportFlopsError):
    """``strict=True`` met an op with no formula, or (``formula=False``) a call whose work no
    formula can count, whose ``reason`` says what to do (values handed to numpy in an eager
    run)."""

    def __init__(self, node: str, op: str, module: str, reason: str, *,
                 formula: bool = True) -> None:
        self.node, self.op, self.module, self.reason = node, op, module, reason
        fix = (f"Give it a working formula with @exportflops.register_formula("
               f"torch.ops.{_op_path(op)}, replace=True) or analyze(..., formulas={{op: fn}}), "
               f"or analyze" if formula else "Or analyze")
        super().__init__(
            f"Could not count {op} (node {node!r} in module {module or '<root>'!r}): {reason}. "
            f"{fix} with strict=False to list it as uncounted and count the rest."
        )


class FormulaError(ExportFlopsError):
    """A formula could not count a node (for example, it needs a size that is symbolic)."""


class InvalidFormulaError(ExportFlopsError, TypeError):
    """A formula table was given something it cannot use: a key that is not an op, a formula
    that is not callable, or (at a node) a formula result that is not a Cost of natural counts."""


class CountError(ExportFlopsError, TypeError):
    """A count that is neither an integer nor an expression in sizes (a float, a bool)."""


class DuplicateFormulaError(InvalidFormulaError):
    """A second formula was registered for an op without ``replace=True``, or an overload's
    formula would shadow the one its packet already has."""


class InputError(ExportFlopsError, ValueError):
    """The example inputs (or ``dynamic_shapes``) cannot be used as given: not tensors, not the
    shapes a saved program was exported for, a dim that does not exist."""


class LayoutError(InputError):
    """A parallel layout cannot be used as given: degrees that do not divide as torchtitan lays
    them out, a rank outside it, a split the model has no plan for (`exportflops.parallel`)."""


class ProfileError(ExportFlopsError):
    """The graph cannot be run as asked: no data (meta), devices that disagree, no CUDA, a
    report without its graph, inputs the program was not exported for; or `FlopsProfiler` has
    no profile because the profiled step's export failed (the cause is chained)."""


class UnknownDeviceError(ExportFlopsError, LookupError):
    """No dense peak is known for this device and dtype; pass ``peak_flop_per_s=``."""


class RooflineError(ExportFlopsError, ValueError):
    """A roofline cannot be drawn from this report as it is (its counts depend on dynamic
    sizes: evaluate them first)."""


class UsageError(ExportFlopsError, ValueError):
    """The command cannot run as written (its MODEL, an option's value): exit 2."""


class NotMeasuredError(ExportFlopsError, ValueError):
    """The report holds no measured latencies (it was analyzed, not profiled), and what was
    asked for needs them: measure it with ``exportflops.profile``."""


class MissingExtraError(ExportFlopsError, ImportError):
    """An optional dependency is not installed (plotly for the HTML report); the message names
    the ``pip install 'exportflops[...]'`` that brings it."""


def optional_module(module: str, *, needed_by: str, extra: str) -> ModuleType:
    """The module ``module`` of an optional dependency, or a `MissingExtraError` naming what
    needs it and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{needed_by} needs {module.split('.')[0]}, which is not installed ({error}). "
            f"Install the extra: pip install 'exportflops[{extra}]'.") from None


class BuildError(ExportFlopsError):
    """The user's code failed while importing or building the model: exit 1."""


class GenerationError(ExportFlopsError):
    """A model cannot be analyzed for generation: it takes no KV cache, or its cache does not
    export; the message says why and what to try."""


def _op_path(op: str) -> str:
    namespace, _, rest = op.partition("::")
    return f"{namespace}.{rest}" if rest else op


class DistributedError(ExportFlopsError):
    """A parallelized model cannot be analyzed as given: a process group is missing or already
    set up, or torch cannot trace its parallelism (FSDP2's hooks); the message says which."""


class DoesNotFitError(InputError):
    """No checkpointing plan brings a training step under the memory budget (`exportflops.fit`):
    the message names the smallest peak reachable and what holds it."""
