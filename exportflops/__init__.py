"""exportflops: FLOPs, MACs and bytes per module and per operator from a torch.export graph.

Top-level names load on first use (PEP 562), so that ``exportflops.records`` and
``exportflops.render`` read and render a saved report without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .version import __version__

#: Public name -> the module that defines it: the analyses, the rendering functions (each
#: returns its text), the records a user reads, the names a formula is written with, and the
#: errors a user catches. Everything else stays importable from its package.
_HOMES = {
    # the analyses
    "analyze": "api",
    "analyze_generation": "generation",
    "profile": "runtime",
    "fake_process_group": "count.ranks",
    "flops_per_batch": "training",
    "memory": "footprint",
    "fit": "planner",
    "conventions": "stacks",
    # DeepSpeed's and fvcore's names for the same analysis
    "get_model_profile": "compat",
    "FlopCountAnalysis": "compat",
    # rendering: each returns its text
    "flops_report": "render",
    "to_csv": "render",
    "to_markdown": "render",
    "roofline_view": "render",
    "to_html": "render.pictures",
    "to_trace": "render.pictures",
    # the records a user reads
    "Report": "records",
    "GenerationReport": "records",
    "MemoryReport": "records",
    "FitPlan": "records",
    "Roofline": "records",
    "Cost": "records",
    "ModuleRecord": "records",
    "NodeRecord": "records",
    "OperatorStats": "records",
    "UncountedOp": "records",
    "StepFlops": "records",
    # writing a formula
    "register_formula": "formulas",
    "OpCall": "formulas",
    "TensorMeta": "formulas",
    "FLOPS_PER_MAC": "records",
    # the errors a user catches (every error is an ExportFlopsError)
    "ExportFlopsError": "errors",
    "ExportError": "errors",
    "InputError": "errors",
    "UncountedOpError": "errors",
    "InvalidFormulaError": "errors",
    "MissingExtraError": "errors",
    "TorchFeatureError": "errors",
}

__all__ = ["__version__", *sorted(_HOMES)]


#: The packages a user reaches by attribute (``exportflops.roofline.roofline(report, device)``,
#: ``exportflops.hf.build("llama")``), imported on first use like the names above.
_PACKAGES = {"budgets", "examples", "formulas", "generation", "hf", "parallel", "records",
             "render", "roofline", "runtime", "stacks", "training"}


def __getattr__(name: str) -> Any:
    if name in _PACKAGES:
        return importlib.import_module(f".{name}", __name__)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'exportflops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return __all__
