"""One collective a rank issues, as a torch-free record."""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal

from ..errors import InputError
from .base import Record


class Collective(Record):
    """A collective communication of one rank (a ``_c10d_functional`` op of the traced graph).

    ``bytes`` is the message size as nccl-tests defines it (doc/PERFORMANCE.md): the all-reduced
    tensor, the gathered output, the reduce-scattered input, the all-to-all input, the broadcast
    tensor. ``bandwidth_factor`` is nccl-tests' bus-bandwidth factor for a ring over the group,
    so ``bytes * bandwidth_factor / link_bytes_per_s`` estimates its time (`seconds`).

    A pipeline stage's point-to-point transfer (`exportflops.parallel.pipeline`) is the same
    record with ``op`` ``send`` or ``recv``: ``bytes`` the tensor's, ``bandwidth_factor`` 1 (the
    tensor crosses the link once), ``group_size`` 2 (the pair), ``mesh_dim`` ``pp``, ``peer`` the
    rank at the other end, ``node`` the stages it goes between (``stage 0 to stage 1``).
    """

    op: str
    """The collective: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
    ``broadcast``; or a pipeline's point-to-point ``send`` or ``recv``."""
    bytes: int
    """Message size in bytes as nccl-tests counts it (see the class docstring)."""
    dtype: str
    """dtype of the message, e.g. ``float32``."""
    phase: Literal["forward", "backward"]
    """``backward`` for a collective of the gradient computation (``mode="train"``)."""
    group_size: int
    """Ranks in the process group (the mesh dimension's size)."""
    group: str
    """The process group's name, as torch's functional collectives name it."""
    mesh_dim: str = ""
    """The device mesh dimension the group spans (``tp``, ``dp``, ...), as the mesh names it:
    the meshes the rank's DTensors live on (one dimension spanning the world gets torch's
    default group), else torch's description of the groups a ``DeviceMesh`` makes; empty for
    any other group."""
    module: str
    """Path of the module that issued it; in the backward, the forward module it
    differentiates (``""`` for the root)."""
    node: str
    """The node's name in the traced joint graph."""
    torch_op: str
    """The traced op, e.g. ``_c10d_functional.all_reduce.default``."""
    bandwidth_factor: float
    """nccl-tests' bus-bandwidth factor: ring all-reduce 2(n-1)/n; all-gather, reduce-scatter
    and all-to-all (n-1)/n; broadcast 1; n the group size. A ``send`` or ``recv``: 1."""
    gradient: Literal["", "input", "weight"] = ""
    """For a collective of a backward counted in two passes (``analyze(split_backward=True)``
    on a parallelized model): ``input`` when it runs in the pass computing the inputs'
    gradients, ``weight`` in the parameters'."""
    peer: int | None = None
    """For a ``send`` or ``recv``: the rank at the other end (the one sent to, or received
    from); None for a collective."""

    def seconds(self, link_bytes_per_s: float) -> float:
        """Time at a bus bandwidth of ``link_bytes_per_s`` (nccl-tests' busbw)."""
        check_link(link_bytes_per_s)
        return self.bytes * self.bandwidth_factor / link_bytes_per_s


def check_link(link_bytes_per_s: Any) -> None:
    """`InputError` unless ``link_bytes_per_s`` is a bandwidth: a finite number of bytes/s > 0
    (zero would divide by zero, a negative one give negative times)."""
    if (isinstance(link_bytes_per_s, bool) or not isinstance(link_bytes_per_s, numbers.Real)
            or not 0 < link_bytes_per_s < math.inf):
        raise InputError(f"link_bytes_per_s={link_bytes_per_s!r}: a collective's time is its "
                         f"bytes over the link's bus bandwidth, in bytes/s > 0; pass a positive "
                         f"bandwidth (50e9 for 50 GB/s), or None for no times.")
