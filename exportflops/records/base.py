"""The base of every record, and the cost every formula, node, module and report carries."""

from __future__ import annotations

from typing import Annotated, Any

import sympy
import pydantic
from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from .symbolic import Evaluator, parse_count

SCHEMA_VERSION = 1

#: One multiply-accumulate is one MAC and this many FLOPs (a multiply and an add): the one
#: statement of the convention (torch's FlopCounterMode and Karpathy's; fvcore counts 1).
FLOPS_PER_MAC = 2


#: The `Cost` fields of bytes read: an op that reads nothing has all of them 0.
READ_FIELDS = ("bytes_read", "weight_bytes_read", "state_bytes_read")


class Record(BaseModel):
    # Field names such as ``model_flops`` are the records' own, not pydantic's namespace.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              protected_namespaces=())


class NotebookRecord(Record):
    """A record a notebook cell shows (`Report`, `GenerationReport`, `Roofline`, the per-rank
    records): its ``_repr_html_``, then its plotly pictures when plotly is installed."""

    def _ipython_display_(self) -> None:
        """What IPython calls instead of its formatters: the HTML as one output, then each
        picture as plotly's own MIME bundle, one output each (`exportflops.render.
        notebook_figures`; no plotly.js in the output, no request)."""
        from ..render.notebook_figures import show

        show(self)


def _dump_count(value: int | sympy.Expr) -> int | str:
    return value if isinstance(value, int) else str(value)


Count = Annotated[Any, PlainValidator(parse_count), PlainSerializer(_dump_count)]
"""An integer, or for dynamic sizes a sympy expression serialized as its string."""


class Cost(Record):
    """Work of one node, module or model: FLOPs, MACs and bytes from tensor sizes x itemsize.

    Formulas return this type (``exportflops.Cost`` is the same class under the name formula
    authors know), so a cost field added here is a field of every formula, node, module and
    report at once.
    """

    flops: Count = 0
    """All floating-point operations: 2 per multiply-accumulate, 1 per pointwise output element
    unless the op's formula documents otherwise."""
    macs: Count = 0
    """Multiply-accumulates of contractions (matmul, linear, einsum, conv, attention)."""
    bytes_read: Count = 0
    """Bytes of the tensors the ops read, each input counted once per op."""
    bytes_written: Count = 0
    """Bytes of the tensors the ops write."""
    weight_bytes_read: Count = 0
    """The part of ``bytes_read`` read from weights: parameters and buffers the model does not
    mutate (the graph signature says which), and views of them; each use reads them again."""
    state_bytes_read: Count = 0
    """The part of ``bytes_read`` read from state the model mutates (a KV cache, running
    statistics: buffers or inputs the graph writes), and views of it."""
    state_bytes_written: Count = 0
    """The part of ``bytes_written`` written into that mutated state."""
    masked_flops: Count = 0
    """The part of ``flops`` spent on (query, key) pairs a causal mask discards."""
    masked_macs: Count = 0
    """The part of ``macs`` spent on (query, key) pairs a causal mask discards."""

    @property
    def matmul_flops(self) -> int:
        """FLOPs of the matmul family alone: 2 per MAC (Karpathy's and torch's convention)."""
        return FLOPS_PER_MAC * self.macs

    @property
    def activation_bytes_read(self) -> int:
        """Bytes read from activations: what ``bytes_read`` holds beyond weights and state."""
        return self.bytes_read - self.weight_bytes_read - self.state_bytes_read

    @property
    def activation_bytes_written(self) -> int:
        """Bytes written to activations: ``bytes_written`` less what went into mutated state."""
        return self.bytes_written - self.state_bytes_written

    @property
    def bytes_moved(self) -> int:
        """``bytes_read + bytes_written``: the traffic a roofline divides by the bandwidth."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOPs per byte moved (None when no byte moves)."""
        moved = self.bytes_moved
        return None if moved == 0 else self.flops / moved

    @property
    def causal_effective_flops(self) -> int:
        """``flops`` without the work a causal mask discards (the unmasked work only)."""
        return self.flops - self.masked_flops

    def __add__(self, other: Cost) -> Cost:
        return Cost(**{name: getattr(self, name) + getattr(other, name)
                         for name in Cost.model_fields})

    def __sub__(self, other: Cost) -> Cost:
        return Cost(**{name: getattr(self, name) - getattr(other, name)
                         for name in Cost.model_fields})

    def scaled(self, factor: int | sympy.Expr) -> Cost:
        """This cost repeated ``factor`` times."""
        return Cost(**{name: getattr(self, name) * factor for name in Cost.model_fields})

    def evaluated(self, sizes: Evaluator) -> Cost:
        """These counts at fixed dynamic sizes: ints."""
        return Cost.model_construct(**{name: sizes.value(getattr(self, name))
                                         for name in Cost.model_fields})


class TensorSpec(Record):
    """Shape and dtype of one tensor."""

    shape: list[int | str]
    """Sizes; a dynamic size is its expression as a string."""
    dtype: str
    """torch dtype name, e.g. ``float32``."""

    @classmethod
    def of(cls, shape, dtype) -> TensorSpec:
        """The spec of a tensor (or a formula's TensorMeta): symbolic sizes as their text."""
        return cls.model_construct(shape=[d if isinstance(d, int) else str(d) for d in shape],
                                   dtype=str(dtype).removeprefix("torch."))

    def evaluated(self, sizes: Evaluator) -> TensorSpec:
        if all(isinstance(d, int) for d in self.shape):
            return self
        return self.model_copy(update={"shape": [sizes.value(d) for d in self.shape]})


def read_as_rank(field: str) -> Any:
    """A record's before-validator: a record written before ``field`` (a rank's index in its
    group) existed reads it as its ``rank``, which it was when the group was the world."""

    def filled(cls, data: Any) -> Any:
        if isinstance(data, dict) and field not in data and "rank" in data:
            return {**data, field: data["rank"]}
        return data

    return pydantic.model_validator(mode="before")(classmethod(filled))

