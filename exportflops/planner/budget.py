"""A memory budget as ``fit`` takes it: bytes, a size with its unit, or a device key."""

from __future__ import annotations

import re

from ..errors import InputError

#: The share of a device's memory ``fit`` leaves free: `exportflops.memory` counts tensor
#: storage only, not the CUDA context, the caching allocator's fragmentation or kernels'
#: workspaces (docs/memory.md). A chosen margin, not a measured one: pass bytes to set your own.
HEADROOM = 0.1

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*")


def budget_bytes(budget: int | str) -> tuple[int, str]:
    """``budget`` in bytes and as a user reads it: an int is bytes; ``"80GiB"``, ``"40GB"``
    (GB = 10^9 bytes, GiB = 2^30); else a key of the device table, its capacity less
    ``HEADROOM``."""
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise InputError(f"budget={budget!r}: give bytes (an int), a size such as '80GiB' or "
                         f"'40GB', or a device key such as 'h100-sxm'.")
    if isinstance(budget, int):
        if budget <= 0:
            raise InputError(f"budget={budget} bytes: a budget is a positive number of bytes.")
        return budget, f"{budget} bytes"
    size = _SIZE.fullmatch(budget)
    if size and size.group(2).upper() in _UNITS:
        return int(float(size.group(1)) * _UNITS[size.group(2).upper()]), budget
    return _device_budget(budget)


def _device_budget(key: str) -> tuple[int, str]:
    from ..device_table import device_row

    row = device_row(key)  # an unknown key: UnknownDeviceError naming the keys
    if row.memory_bytes is None:
        raise InputError(f"budget={key!r}: the device table's {key} row covers boards with "
                         f"different memory; pass your board's bytes.")
    usable = int(row.memory_bytes * (1 - HEADROOM))
    return usable, f"{key} ({row.memory_bytes} bytes less {HEADROOM:.0%} headroom)"
