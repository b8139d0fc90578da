"""Expert parallelism: ``analysis`` holds each rank's expert work and all-to-alls from the
single-device count (`analyze_experts`), ``fsdp`` FSDP2's collectives when the experts sit inside
FSDP2 (torchtitan's layout), ``tp`` the MoE layers routing each tensor-parallel rank's share of
the tokens, and ``ranks`` expert parallelism composed with tp and fsdp on a `Layout` (what
`analyze_ranks` calls).
"""

from .entry import analyze_experts

__all__ = ["analyze_experts"]
