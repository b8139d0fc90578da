"""Context parallelism: ``analysis`` splits a causal sequence over the rings of ring attention
from the symbolic single-device count (`analyze_context`), ``tp`` each ring place's
tensor-parallel rank read at four sequence lengths, and ``ranks`` context parallelism composed
with tp and fsdp on a `Layout` (what `analyze_ranks` calls); ``memory`` the step's memory of a
ring rank, with tp and fsdp too (what `memory_ranks` calls).
"""

from .entry import analyze_context

__all__ = ["analyze_context"]
