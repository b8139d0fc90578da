"""A training step's FLOPs and its measured time as achieved FLOP/s and MFU, for a plain loop.

MFU (model FLOPs utilization, PaLM: Chowdhery et al. 2022, arXiv:2204.02311, appendix B) is
``model FLOPs / seconds / peak``: the model FLOPs of the step (`FlopsPerBatch`'s count, no
activation-checkpoint recompute) over the device's *dense* peak in the dtype the matmuls run in.

The peak comes from `exportflops.roofline.devices`, by the rule `exportflops.profile` follows
too (`devices.device_peak`), never from a guess:

1. ``peak_flop_per_s=`` given: that figure (``False``: no MFU, the achieved rate only);
2. ``device=`` a key of the table: that row (``h100-sxm``, ``a100-sxm-80gb``, ...);
3. ``device=`` a torch device (``"cuda:1"``, ``torch.device("cpu")``), else the CUDA device
   here, else the CPU: a CUDA device's name matched whole against the table (`device_table.lookup`;
   a name the table lacks is an `UnknownDeviceError` naming ``peak_flop_per_s=`` and
   ``device=``, never a fallback to a row that looks close), the CPU's *estimate* (threads x
   clock x vector width: ``DensePeak.estimated``, and its source says so), and any other
   device an `UnknownDeviceError`.

Every table figure is dense: NVIDIA prints Hopper, Ada and Ampere tensor-core peaks with 2:4
sparsity (H100 SXM bf16 "1,979 teraFLOPS*", https://www.nvidia.com/en-us/data-center/h100/),
and an MFU against that figure reads half of what it is.

Timing is the other half: `StepTimer` synchronizes CUDA at both ends of the timed block, since
kernels run asynchronously and the host's clock would otherwise stop before the GPU does.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from time import perf_counter
from types import TracebackType

import torch

from ..errors import UnknownDeviceError
from ..records import Throughput
from .. import device_table
from ..roofline import devices
from ..runtime.measure import NOT_GIVEN, check_peak_argument

#: The dtype whose peak MFU is taken against unless told: mixed-precision training runs its
#: matmuls in bfloat16, and PaLM's and torchtitan's MFU are against that peak.
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True)
class DensePeak:
    """The dense peak a run's MFU is taken against, resolved once (`dense_peak`)."""

    flop_per_s: float | None
    """FLOP/s, or None for no MFU."""
    source: str
    device: str
    dtype: str
    estimated: bool = False
    """True for the CPU's estimate: an MFU against it is labelled so where it is logged."""

    def throughput(self, flops: int, seconds: float) -> Throughput:
        """The `Throughput` of ``flops`` done in ``seconds`` against this peak."""
        if isinstance(flops, bool) or not isinstance(flops, numbers.Integral) or flops < 0:
            raise ValueError(f"flops is a count of FLOPs (an int >= 0), got {flops!r}")
        if not (isinstance(seconds, numbers.Real) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds is a measured time (> 0), got {seconds!r}")
        achieved = int(flops) / seconds
        return Throughput(
            flops=int(flops), seconds=float(seconds), achieved_flop_per_s=achieved,
            peak_flop_per_s=self.flop_per_s,
            mfu=None if self.flop_per_s is None else achieved / self.flop_per_s,
            device=self.device, dtype=self.dtype, peak_source=self.source)


def dense_peak(*, peak_flop_per_s: float | bool | None = None,
               device: str | torch.device | None = None,
               dtype: str | torch.dtype = DEFAULT_DTYPE) -> DensePeak:
    """The dense peak for MFU: ``peak_flop_per_s`` if given (``False``: none), else the row of
    the device table ``device`` names, else the peak of the device ``device`` is (by default
    the CUDA device here, else the CPU, whose peak is an estimate): the rule of the module's
    docstring.

    ``dtype`` is the dtype the step's matmuls run in (``"bfloat16"``, ``torch.float16``, ...);
    float32 reads the TF32 peak unless torch's float32 matmul precision is ``"highest"``, as
    `exportflops.profile` does.
    """
    peak = check_peak_argument(peak_flop_per_s, NOT_GIVEN, "dense_peak()")
    key = _dtype_key(dtype)
    if peak is not None and device is not None:
        raise TypeError(f"dense_peak() got both peak_flop_per_s={peak_flop_per_s!r} and "
                        f"device={device!r}: pass the figure or the table's device, not both")
    if peak is False:
        return DensePeak(None, "none: peak_flop_per_s=False", "none", key)
    if peak is not None:
        return DensePeak(float(peak), "user", "user", key)
    if isinstance(device, str) and device in _TABLE_KEYS:
        return _row_peak(device_table.device_row(device), key)
    run_on = _run_on(device)
    try:
        found = devices.device_peak(run_on, key)
    except UnknownDeviceError as error:
        if run_on.type != "cuda":
            raise
        raise UnknownDeviceError(f"{error} Or name a row of the table: device='h100-sxm'.") \
            from None
    return DensePeak(found.flop_per_s, found.source, found.device, key, found.estimated)


def throughput_of(flops: int, seconds: float, *, peak_flop_per_s: float | bool | None = None,
                  device: str | None = None,
                  dtype: str | torch.dtype = DEFAULT_DTYPE) -> Throughput:
    """Achieved FLOP/s and MFU of ``flops`` done in ``seconds``; the peak as `dense_peak`
    finds it. In a loop, resolve the peak once: ``peak = dense_peak(...)``, then
    ``peak.throughput(flops, seconds)`` each step."""
    return dense_peak(peak_flop_per_s=peak_flop_per_s, device=device,
                      dtype=dtype).throughput(flops, seconds)


def _dtype_key(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    tf32 = torch.get_float32_matmul_precision() != "highest"
    key = device_table.matmul_dtype(name, tf32=tf32)
    if key not in device_table.DTYPES:
        raise ValueError(f"dtype {dtype!r} has no peak in the device table; its dtypes are "
                         f"{', '.join(device_table.DTYPES)}")
    return key


#: The device table's keys: ``device=`` names a row by one of them.
_TABLE_KEYS = frozenset(d.key for d in device_table.DEVICES)


def _row_peak(row: device_table.Device, key: str) -> DensePeak:
    if key not in row.dense_tflops:
        raise UnknownDeviceError(
            f"The device table has no dense {key} peak for {row.key} (it lists "
            f"{', '.join(row.dense_tflops)}). Pass dtype= one of those, or "
            f"peak_flop_per_s=<dense FLOP/s from the datasheet>.")
    tflops = row.dense_tflops[key]
    return DensePeak(tflops * device_table.TERA, f"{row.key} {key} dense {tflops:g} TFLOP/s, "
                                            f"{row.source} ({row.dated})", row.key, key)


def _run_on(device: str | torch.device | None) -> torch.device:
    """The device ``device`` names (a torch device or its string), by default the CUDA
    device here, else the CPU; a string that is neither a device nor a table key is an
    `UnknownDeviceError` listing the keys."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        device_table.device_row(str(device))  # raises, listing the table's keys
        raise


class StepTimer:
    """Wall-clock seconds of a ``with`` block (or from `start` to `stop`), CUDA synchronized
    when it starts and ends.

    ``time.perf_counter`` is the clock (monotonic). The synchronization waits for the kernels
    queued before the block (so they are not charged to it) and for the block's own (so they
    are); it runs only when this process has initialized CUDA. Reusable: each block sets
    ``seconds`` anew.
    """

    def __init__(self) -> None:
        self.seconds: float | None = None
        """The last block's seconds; None before the first block ends."""
        self._start = 0.0

    def start(self) -> None:
        """Begins a span."""
        _synchronize()
        self._start = perf_counter()

    def stop(self) -> float:
        """Ends the span begun by `start`; its seconds."""
        _synchronize()
        self.seconds = perf_counter() - self._start
        return self.seconds

    def __enter__(self) -> StepTimer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def _synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
