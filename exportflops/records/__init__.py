"""Every public record: strict pydantic models with a documented field each. Imports no torch.

A `Report` is plain data: it serializes to JSON and back (`Report.model_validate_json`), so a
saved report renders and queries without the model.
"""

from .base import FLOPS_PER_MAC, SCHEMA_VERSION, Count, Cost, Record, TensorSpec
from .collectives import Collective
from .conventions import Conventions, StackCount, StackTerm
from .context import ContextParallelReport, ContextRank, RingSend, SequenceChunk
from .experts import ExpertParallelReport, ExpertRank
from .fit import FitCandidate, FitPlan
from .generation import GenerationReport
from .memory import (DeviceFit, KindBytes, MemoryOnDevice, MemoryPoint, MemoryReport,
                     ModuleMemory, RanksMemory)
from .pipeline import PipelineAction, PipelineRank, PipelineReport, PipelineStage
from .report import (ModuleRecord, NodeRecord, NodeStatus, OperatorStats, Report,
                     SizeSymbolRecord, TiedParameter, UncountedOp)
from .roofline import Roofline, RooflineModule, RooflineNode
from .symbolic_memory import (KindExpressions, MemoryAtSizes, MemorySize, SymbolicMemoryReport,
                              SymbolicPoint)
from .timing import ModuleTiming, NodeTiming, RuntimeProfile, Timing
from .training import DocumentFlops, StepFlops, Throughput

__all__ = ["FLOPS_PER_MAC", "SCHEMA_VERSION", "Collective", "ContextParallelReport",
           "ContextRank", "Conventions", "Cost", "Count", "DeviceFit", "DocumentFlops",
           "ExpertParallelReport", "ExpertRank", "FitCandidate", "FitPlan",
           "GenerationReport", "KindBytes", "MemoryOnDevice", "MemoryPoint", "MemoryReport",
           "ModuleMemory", "RanksMemory", "KindExpressions", "MemoryAtSizes", "MemorySize",
           "SymbolicMemoryReport", "SymbolicPoint",
           "ModuleRecord", "ModuleTiming", "NodeRecord", "NodeStatus",
           "NodeTiming", "OperatorStats", "PipelineAction", "PipelineRank", "PipelineReport",
           "PipelineStage", "Record", "Report", "RingSend", "Roofline",
           "RooflineModule", "RooflineNode", "RuntimeProfile", "SequenceChunk", "SizeSymbolRecord",
           "StackCount", "StackTerm", "StepFlops", "TensorSpec", "Throughput", "TiedParameter",
           "Timing", "UncountedOp"]
