"""How much memory a run on cpu may take, and telling a run refused past it: a model or an
example too large for the machine ends in an error that says so, not in the kernel killing the
process."""

from __future__ import annotations

import collections
import contextlib
import os

#: The share of the free memory a capped run leaves to the rest of the machine: MemAvailable
#: counts page cache the kernel gives back only in part, and other processes go on growing.
HEADROOM = 0.1


def free_bytes(root: str = "/") -> int | None:
    """What the machine can give this process safely: its available memory and free swap
    (Linux's /proc/meminfo), or less where the process's cgroup (a container's limit) leaves
    less (`_cgroup_room`), less `HEADROOM`; None where /proc/meminfo cannot be read. ``root``:
    where the file system starts (a test's folder)."""
    try:
        with open(os.path.join(root, "proc/meminfo")) as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
        free = fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None
    room = _cgroup_room(root)
    if room is not None:
        free = min(free, room)
    return int(free * (1 - HEADROOM))


def _cgroup_room(root: str) -> int | None:
    """What this process's memory cgroups still allow: each one's limit less its usage (v2's
    memory.max and memory.current, v1's memory.limit_in_bytes and memory.usage_in_bytes, at
    the path /proc/self/cgroup names), the least; None where none sets a limit."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as cgroups:
            entries = [line.rstrip("\n").split(":", 2) for line in cgroups if line.count(":") >= 2]
    except OSError:
        return None
    rooms = []
    for _, controllers, path in entries:
        if controllers == "":
            folder, files = "sys/fs/cgroup", ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            folder, files = "sys/fs/cgroup/memory", ("memory.limit_in_bytes",
                                                     "memory.usage_in_bytes")
        else:
            continue
        try:
            limit, used = (_read(os.path.join(root, folder, path.lstrip("/"), name))
                           for name in files)
        except (OSError, ValueError):
            continue
        if limit is not None and used is not None:
            rooms.append(limit - used)
    return min(rooms) if rooms else None


def _read(path: str) -> int | None:
    """A cgroup file's number; None for no limit ("max", or v1's page-rounded 2**63)."""
    with open(path) as file:
        text = file.read().strip()
    return None if text == "max" or int(text) >= 2**62 else int(text)


@contextlib.contextmanager
def memory_capped(extra: int | None):
    """Allocations past ``extra`` bytes more than the process's data held fail for the block
    (torch raises its allocator's RuntimeError), where the platform lets a process cap itself
    (Linux's RLIMIT_DATA: writable private memory, thread stacks included, not the address
    space malloc's arenas reserve unused, which RLIMIT_AS would count against the cap); never
    above a limit already set. ``extra`` None: no cap. Yields whether this cap is the one that
    binds (not a lower limit the user set: ``ulimit -d``)."""
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
        yield cap == held + extra
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


@contextlib.contextmanager
def within_free_memory(model_name: str):
    """The block run capped at the memory the machine has free (`free_bytes`), an allocation
    refused past it a `UsageError` that says what to pass instead, not the kernel killing the
    process (BLT's hash embeddings are 12 GiB at any depth). Its arguments are the hf
    library's (``device="meta"``, ``layers=``), which the command writes as its flags."""
    from ..errors import UsageError

    free = free_bytes()
    with memory_capped(free) as capped:
        try:
            yield
        except UsageError:
            raise
        except Exception as error:
            refused = out_of_memory(error) if capped else None
            if refused is None:
                raise
            text = str(refused).strip()
            first = text.splitlines()[0] if text else "an allocation was refused"
            raise UsageError(
                f"{model_name} on device=\"cpu\" needs more memory than this machine has free "
                f"({free / 2**30:.1f} GiB; {type(refused).__name__}: {first}). Pass "
                f"device=\"meta\", which counts the same without allocating; where real values "
                f"are needed (profiling), a smaller model or example (layers=, seq=, "
                f"batch=).") from error
