"""Training steps: each batch's exact FLOPs, and where trainers ask for them.

`per_batch.flops_per_batch` analyzes a model once, symbolic in the batch and sequence sizes,
and returns a function of a batch (`terms` splits the counts by how they scale, `batches`
reads padding and packed documents off a batch).
"""

from .per_batch import FlopsPerBatch, flops_per_batch

__all__ = ["FlopsPerBatch", "flops_per_batch"]
