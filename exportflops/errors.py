"""The exceptions exportflops raises; each message names what failed and what to do next."""

from __future__ import annotations


class ExportFlopsError(Exception):
    """Base class of every error raised by exportflops."""


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
    """``strict=True`` met an op with no formula."""

    def __init__(self, node: str, op: str, module: str, reason: str) -> None:
        self.node, self.op, self.module, self.reason = node, op, module, reason
        super().__init__(
            f"Could not count {op} (node {node!r} in module {module or '<root>'!r}): {reason}. "
            f"Register one with @exportflops.register_formula(torch.ops.{_op_path(op)}), pass "
            f"formulas={{op: fn}} to analyze(), or analyze with strict=False to list it as uncounted."
        )


class FormulaError(ExportFlopsError):
    """A formula could not count a node (for example, it needs a size that is symbolic)."""


class DuplicateFormulaError(ExportFlopsError):
    """A second formula was registered for an op without ``replace=True``."""


def _op_path(op: str) -> str:
    namespace, _, rest = op.partition("::")
    return f"{namespace}.{rest}" if rest else op
