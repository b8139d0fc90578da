"""Where the memory of one step goes: the peak, what holds it, per module, and the step's
timeline of live bytes. Imports no torch. Definitions: docs/memory.md."""

from __future__ import annotations

from typing import Any, Literal

from .base import SCHEMA_VERSION, Record
from ..device_table import device_row
from ..errors import UnknownDeviceError

Phase = Literal["forward", "backward", "optimizer"]


class KindBytes(Record):
    """Bytes of live tensor storage, by what the storage holds."""

    parameters: int = 0
    """The model's parameters (a tied parameter once)."""
    buffers: int = 0
    """The model's buffers (running statistics, masks), used or not, and the tensors its
    modules hold as plain attributes."""
    gradients: int = 0
    """The parameters' gradients (``.grad``), from the backward op that makes each."""
    optimizer: int = 0
    """The optimizer's states (AdamW: ``exp_avg``, ``exp_avg_sq`` and the 0-dim ``step`` per
    parameter; SGD: the momentum buffer) and, with ``precision="bf16-master"``, the fp32
    master copy of the parameters."""
    activations: int = 0
    """Tensors the forward made that autograd saved for the backward."""
    temporaries: int = 0
    """Every other tensor the step makes: the forward's intermediates and outputs, the
    backward's gradients of activations and its intermediates, the optimizer's."""
    inputs: int = 0
    """The tensors passed to the model."""

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in type(self).model_fields)


class MemoryPoint(Record):
    """The live bytes right after one ATen op of the step made its outputs (ops that return no
    tensor, such as ``prim.device``, are not points)."""

    index: int
    """The op's position in the step, from 0."""
    op: str
    """The ATen op (``aten.mm.default``)."""
    module: str
    """Path of the module the op ran in (in the backward: the module whose forward op made
    the autograd node running it); ``""``: the root, the loss or the optimizer."""
    phase: Phase
    """forward (the loss included), backward or optimizer."""
    live: KindBytes
    """Bytes live at this point, by kind."""


class ModuleMemory(Record):
    """What one module of the model holds over the step."""

    path: str
    """Path as ``named_modules()`` names it; ``""`` is the root."""
    type: str
    """Qualified class name."""
    depth: int
    """0 for the root, 1 for its children, ..."""
    activations: int
    """Bytes the module and its children save for the backward."""
    own_activations: int
    """The part of ``activations`` saved by ops of the module itself, not a child's."""
    largest_temporary: int
    """The largest temporary (one storage) made in the module or its children, forward or
    backward."""
    largest_temporary_op: str = ""
    """The op that made it, with its phase (``aten.bmm.default (backward)``)."""


class DeviceFit(Record):
    """Whether a step's peak fits a device's memory (`MemoryReport.fits`)."""

    device: str
    """The device table's key (``h100-sxm``)."""
    fits: bool
    """Whether ``peak_bytes`` is at most ``capacity_bytes``."""
    capacity_bytes: int
    """The device's memory: its datasheet's figure in GB, read as 10^9 bytes."""
    peak_bytes: int
    """The step's peak (`MemoryReport.peak_bytes`)."""
    headroom_bytes: int
    """``capacity_bytes - peak_bytes``; negative when the step does not fit."""
    source: str
    """The datasheet the capacity comes from."""


class MemoryReport(Record):
    """The memory of one step of a model: its peak, what holds it, and its timeline.

    ``mode="train"``: step 2 of a loop of forward, loss, backward, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``; ``mode="forward"``: one forward under no_grad.
    Bytes are storage sizes (a view or an in-place result shares its base's storage).
    """

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    model: str
    """The analyzed model's class."""
    mode: Literal["train", "forward"]
    """What the step runs."""
    optimizer: str = ""
    """The optimizer of a training step (``adamw``, ``adam``, ``sgd``, ``adagrad``,
    ``rmsprop``; the class of an instance given, ``Adagrad``); ``""`` in forward."""
    allocator: Literal["exact", "cuda"]
    """``exact``: each storage's bytes; ``cuda``: rounded up to whole 512-byte blocks as the CUDA
    caching allocator hands them out."""
    peak_bytes: int
    """The most bytes of live tensor storage at any point of the step."""
    peak_phase: Phase
    """The phase the peak is in."""
    peak_node: str
    """The op at the peak, with its position in the step (``aten.mm.default #412``)."""
    peak_module: str
    """Path of the module that op ran in."""
    by_kind: KindBytes
    """The live bytes at the peak, by kind (they sum to ``peak_bytes``)."""
    max_by_kind: KindBytes
    """Each kind's own most bytes over the step (at different points)."""
    modules: list[ModuleMemory]
    """Every module, in ``named_modules()`` order."""
    timeline: list[MemoryPoint]
    """The live bytes after every op of the step, in order."""
    world_size: int = 1
    """The ranks of the layout the step ran on (`exportflops.parallel.memory_ranks`); 1: one
    device."""
    rank: int = 0
    """The rank whose step this is."""

    def to_pandas(self, rows: Literal["timeline", "modules"] = "timeline") -> Any:
        """The timeline (one row per op: index, op, module, phase, the live bytes of each kind
        and their total) or the modules (one row each, the fields of `ModuleMemory`) as a
        pandas DataFrame (needs ``pip install 'exportflops[pandas]'``), bytes as integers."""
        from ..render.memory import memory_frame

        return memory_frame(self, rows)

    def fits(self, device: str) -> DeviceFit:
        """Whether the peak fits the memory of ``device``, a key of the device table
        (exportflops/device_table.py); an unknown key is an `UnknownDeviceError` naming the
        keys. Only tensor storage is counted (docs/memory.md: not the CUDA context, the
        allocator's reserve or kernels' workspaces), so a step that fits by a few hundred MB
        may still run out of memory."""

        row = device_row(device)
        if row.memory_bytes is None:
            raise UnknownDeviceError(
                f"The device table's {device} row covers boards with different memory; "
                f"compare peak_bytes ({self.peak_bytes}) with your board's "
                f"torch.cuda.get_device_properties(0).total_memory.")
        return DeviceFit(device=device, fits=self.peak_bytes <= row.memory_bytes,
                         capacity_bytes=row.memory_bytes, peak_bytes=self.peak_bytes,
                         headroom_bytes=row.memory_bytes - self.peak_bytes, source=row.source)


class MemoryOnDevice(Record):
    """A step's memory and whether it fits a device: what ``exportflops MODEL --memory
    --device-model KEY`` writes as JSON."""

    memory: MemoryReport
    """The step's memory."""
    fit: DeviceFit
    """``memory.fits(KEY)``."""


class RanksMemory(Record):
    """The memory of one step on every rank of a layout (`exportflops.parallel.memory_ranks`)."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record layout."""
    layout: str
    """The layout (``Layout(fsdp=2, tp=2)``)."""
    ranks: list[MemoryReport]
    """Each rank's step, in rank order."""
    peak_rank: int
    """The rank with the highest peak (the first of equal peaks)."""
    peak_bytes: int
    """That rank's peak: what each device of the layout must hold."""
