"""exportflops: FLOPs, MACs and bytes per module and per operator from a torch.export graph.

Top-level names load on first use (PEP 562), so that ``exportflops.records`` and
``exportflops.render`` read and render a saved report without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .version import __version__

#: Public name -> the module that defines it.
_HOMES = {
    "analyze": "api",
    "fake_process_group": "parallel",
    "Collective": "records",
    "DistributedError": "errors",
    "analyze_generation": "generation",
    "get_model_profile": "compat",
    "FlopCountAnalysis": "compat",
    "ExportError": "errors",
    "ExportFlopsError": "errors",
    "CountError": "errors",
    "DuplicateFormulaError": "errors",
    "InvalidFormulaError": "errors",
    "Progress": "progress",
    "FormulaError": "errors",
    "InputError": "errors",
    "UsageError": "errors",
    "TorchFeatureError": "errors",
    "BuildError": "errors",
    "ProfileError": "errors",
    "UncountedOpError": "errors",
    "UnknownDeviceError": "errors",
    "RooflineError": "errors",
    "GenerationError": "errors",
    "FLOPS_PER_MAC": "records",
    "Counts": "records",
    "GenerationReport": "records",
    "ModuleRecord": "records",
    "NodeRecord": "records",
    "OperatorStats": "records",
    "Report": "records",
    "Roofline": "records",
    "RooflineModule": "records",
    "RooflineNode": "records",
    "TensorSpec": "records",
    "TiedParameter": "records",
    "UncountedOp": "records",
    "FORMULAS": "formulas",
    "Cost": "formulas",
    "FormulaTable": "formulas",
    "OpCall": "formulas",
    "TensorMeta": "formulas",
    "register_formula": "formulas",
    "RenderOptions": "render",
    "flops_report": "render",
    "to_csv": "render",
    "to_markdown": "render",
    "roofline_view": "render",
    "profile": "runtime",
    "to_html": "render.pictures",
    "to_trace": "render.pictures",
    "MissingExtraError": "errors",
    "NotMeasuredError": "errors",
    "FlopsProfiler": "runtime.profiler",
}

__all__ = ["__version__", *sorted(_HOMES)]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'exportflops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return __all__
