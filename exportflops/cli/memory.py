"""How much memory a run on cpu may take, and telling a run refused past it: a model or an
example too large for the machine ends in an error that says so, not in the kernel killing the
process."""

from __future__ import annotations

import collections
import contextlib

#: The share of the free memory a capped run leaves to the rest of the machine: MemAvailable
#: counts page cache the kernel gives back only in part, and other processes go on growing.
HEADROOM = 0.1


def free_bytes() -> int | None:
    """What the machine can give this process safely: its available memory and free swap
    (Linux's /proc/meminfo), less `HEADROOM`; None where that cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
        return int((fields["MemAvailable"] + fields.get("SwapFree", 0)) * (1 - HEADROOM))
    except (OSError, KeyError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def memory_capped(extra: int | None):
    """Allocations past ``extra`` bytes more than the process's data held fail for the block
    (torch raises its allocator's RuntimeError), where the platform lets a process cap itself
    (Linux's RLIMIT_DATA: writable private memory, not the address space that thread stacks
    and malloc arenas reserve, which RLIMIT_AS would count against the cap); never above a
    limit already set. ``extra`` None: no cap. Yields whether a cap was set."""
    try:
        import resource

        with open("/proc/self/status") as status:
            held = next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmData:"))
    except (ImportError, OSError, StopIteration, ValueError):
        extra = None
    if extra is None:
        yield False
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = min(limit for limit in (soft, hard, held + extra) if limit != resource.RLIM_INFINITY)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield True
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def out_of_memory(error: BaseException) -> BaseException | None:
    """The allocation refused (Python's MemoryError or torch's allocator's) that ``error`` is,
    or was raised from or while handling (draft_export's failure sits in the context of the
    `ExportError` that quotes it), the deepest where errors quote it; None if none is."""
    errors, seen, refused = collections.deque([error]), set(), None
    while errors:
        error = errors.popleft()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
            refused = error
        errors += [error.__cause__, error.__context__]
    return refused
