"""The name transformers gives a model's KV cache: ``cache`` since transformers 5.24, as the
forward's argument and the output's field; ``past_key_values`` before (still taken, with a
deprecation warning, until 5.40). torch.export keys ``dynamic_shapes`` by the forward's own
argument names, so the cache goes in under the name the forward declares."""

from __future__ import annotations

import inspect
from typing import Any


def cache_argument(model: Any) -> str:
    """The keyword ``model.forward`` takes its cache by."""
    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


def returned_cache(output: Any) -> Any:
    """The cache a transformers model returned in ``output`` (a ``ModelOutput``)."""
    fields = getattr(output, "__dataclass_fields__", {})
    return output.cache if "cache" in fields else output.past_key_values
