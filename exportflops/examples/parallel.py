"""Tensor-parallel plans of the built-in examples: ``parallelize(model, mesh)`` per example name,
which the command's ``--tp N`` applies under `exportflops.fake_process_group`.

The Llama plan is torchtitan's (``torchtitan/models/llama3/infra/parallelize.py``, without
sequence and loss parallel): the token embedding split over the vocabulary (row-wise, its output
all-reduced), query/key/value and w1/w3 column-wise, wo and w2 row-wise (Megatron's split,
Shoeybi et al. 2019, section 3), the output projection column-wise with its logits gathered, the
norms replicated. As torchtitan does, each attention then counts its local heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.nn as nn

from ..errors import LayoutError
from .llama import Llama


def parallelize_llama(model: Llama, mesh) -> Llama:
    """``model`` (the built-in `Llama`) split over the 1-D ``mesh``: torchtitan's plan above."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    tp, config = mesh.size(), model.config
    if config.tie_embeddings:
        raise ValueError("the Llama plan splits the embedding by rows and the output by "
                         "columns: it cannot shard one tied weight both ways; untie them")
    if config.n_heads % tp or config.n_kv_heads % tp:
        heads = math.gcd(config.n_heads, config.n_kv_heads)
        raise LayoutError(f"tp={tp}: the Llama plan gives each rank whole heads, and {tp} does "
                          f"not divide n_heads ({config.n_heads}) and n_kv_heads "
                          f"({config.n_kv_heads}): pass tp= a divisor of {heads}.")
    layer = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
             "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel()}
    plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
            **{f"layers.*.{path}": style for path, style in layer.items()}}
    parallelize_module(model, mesh, plan)
    for block in model.layers:
        block.attention.n_heads //= tp  # the heads of this rank's wq/wk/wv columns
        block.attention.n_kv_heads //= tp
    return model


#: Built-in example class -> its ``parallelize(model, mesh)``.
PARALLELIZE: dict[type, Callable[[nn.Module, object], nn.Module]] = {Llama: parallelize_llama}
