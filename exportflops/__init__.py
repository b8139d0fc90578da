"""exportflops: FLOPs, MACs and bytes per module and per operator from a torch.export graph."""

__version__ = "0.1.0"

from .api import analyze  # noqa: E402
from .errors import (  # noqa: E402
    DuplicateFormulaError,
    ExportError,
    ExportFlopsError,
    FormulaError,
    UncountedOpError,
)
from .formulas import (  # noqa: E402
    FLOPS_PER_MAC,
    FORMULAS,
    Cost,
    FormulaTable,
    OpCall,
    TensorMeta,
    register_formula,
)
from .devices import UnknownDeviceError  # noqa: E402
from .render import flops_report, to_csv, to_markdown  # noqa: E402
from .runtime import FlopsProfiler, ProfileError, profile  # noqa: E402
from .records import (  # noqa: E402
    Counts,
    ModuleRecord,
    NodeRecord,
    OperatorStats,
    Report,
    TensorSpec,
    TiedParameter,
    UncountedOp,
)

__all__ = [
    "FLOPS_PER_MAC", "FORMULAS", "Cost", "Counts", "DuplicateFormulaError", "ExportError",
    "ExportFlopsError", "FlopsProfiler", "FormulaError", "FormulaTable", "ModuleRecord",
    "NodeRecord", "OpCall", "OperatorStats", "ProfileError", "Report", "TensorMeta", "TensorSpec",
    "TiedParameter", "UncountedOp", "UncountedOpError", "UnknownDeviceError", "analyze",
    "flops_report", "profile", "register_formula", "to_csv", "to_markdown",
]
