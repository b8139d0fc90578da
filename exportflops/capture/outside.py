"""The calls of an eager run where a tensor's values leave torch, or come back from outside: work
the dispatcher never sees, recorded as uncounted (`capture.eager`).

torch.export refuses a forward whose values leave torch (``x.numpy()``: "not supported for
tensor subclasses"); an eager run takes it, and its dispatch-level record holds none of the
arithmetic numpy or Python then does. A ``TorchFunctionMode`` sees the Python calls that hand
a tensor's values out, as it sees every method of a tensor; the recorder sees the one op by
which host data becomes a tensor (``aten.lift_fresh``, dispatched by ``torch.tensor``,
``torch.as_tensor``, ``torch.asarray`` and ``torch.from_numpy``). Which of them hide work:

1. ``Tensor.numpy``, ``Tensor.__array__`` and ``Tensor.__dlpack__`` always: the values go to
   numpy or to code that reads their memory (a C extension), whose arithmetic torch never
   sees.
2. ``Tensor.item``, ``Tensor.tolist``, ``float()``, ``int()``, ``complex()`` of a floating or
   complex tensor: its values go to Python, for arithmetic there (a size or an index is an
   integer). The same reads of an integer or bool tensor are free: they decide the sizes,
   indices and branches that the recorded ops then follow (a vision tower's image grid read
   by ``.tolist()``), as `Report.value_guards` decisions are for an exported program; so is
   ``bool()`` of any tensor, a branch the run took.
3. A tensor made from host data after a call of 1 or 2 that hides work: it may hold what was
   computed outside torch. One made before any such read holds constants
   (``torch.tensor([0.5, 2.0])``) or integers Python computed from sizes and indices it
   read (``cu_seqlens`` from ``lengths.tolist()``), which export would trace as symbolic
   integer arithmetic, no FLOPs either; it is free.

4. A buffer the run allocated (``torch.empty``) that an op reads, or the model returns, with
   no dispatched op having written it: code outside torch filled it (`Unfilled`).

``Tensor.data_ptr`` is not among the calls: it reads an address, not values (torch's own RNN
modules and transformers compare addresses to find shared storage); a C extension that writes
through it into a new buffer is seen by 4. One that writes into a tensor an op filled before,
or a pybind function that computes and returns plain numbers, is not seen.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from ..graph.walk import storage_id
from ..torch_internals import pytree

#: Tensor methods that hand a tensor's data to code outside torch, whatever its dtype (1.).
_TO_FOREIGN = {"numpy", "__array__", "__dlpack__"}
#: Tensor methods that hand a tensor's values to Python (2.).
_TO_PYTHON = {"item", "tolist", "__float__", "__int__", "__complex__"}
#: The Python makers of a tensor from host data that the function mode sees; the one it does
#: not (``torch.from_numpy`` takes no tensor, so no override reaches it) is named by default.
_MAKERS = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor",
           torch.asarray: "torch.asarray"}
UNSEEN_MAKER = "torch.from_numpy"
#: The op every maker of a tensor from host data dispatches (3.).
LIFT_FRESH = torch.ops.aten.lift_fresh.default


class HostCalls(TorchFunctionMode):
    """Sees each call that hands a tensor's values out of torch, and which maker of a tensor
    from host data runs. ``report(call, tensor, reason)`` is called for each read that hides
    work; ``reads`` names them."""

    def __init__(self, report: Callable[[str, torch.Tensor, str], None],
                 where: Callable[[], str]) -> None:
        super().__init__()
        self.report, self.where = report, where
        self.reads: list[str] = []
        self.making = ""
        """The maker of a tensor from host data that is running, where the mode saw it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func in _MAKERS:
            self.making = _MAKERS[func]
            try:
                return func(*args, **kwargs)
            finally:
                self.making = ""
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if tensor is not None and name in _TO_FOREIGN | _TO_PYTHON:
            why = _hidden(name, tensor)
            if why:
                self.reads.append(f"Tensor.{name} in {self.where()}")
                self.report(f"Tensor.{name}", tensor, why)
        return func(*args, **kwargs)

    def made_from_host(self) -> tuple[str, str]:
        """The maker of the tensor ``aten.lift_fresh`` makes now, and why it hides work (empty
        where no read before it did)."""
        maker = self.making or UNSEEN_MAKER
        if not self.reads:
            return maker, ""
        return maker, (f"a tensor made by {maker} from host data after the run handed "
                       f"values out of torch ({', '.join(dict.fromkeys(self.reads))}): what was "
                       f"computed on them outside torch is not counted. Keep the values in "
                       f"tensors and compute on them with torch ops to count it")


def _hidden(name: str, tensor: torch.Tensor) -> str:
    """Why the call ``Tensor.<name>`` on ``tensor`` hides work (see the module's docstring),
    or empty where it does not."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if name in _TO_FOREIGN:
        return (f"the values of a {dtype} tensor left torch (Tensor.{name}): what numpy or "
                f"other code computes on them is not counted. Compute it with torch ops to "
                f"count it")
    if tensor.is_floating_point() or tensor.is_complex():
        return (f"the values of a {dtype} tensor left torch for Python (Tensor.{name}): "
                f"Python's arithmetic on them is not counted. Keep them in a tensor to count "
                f"it")
    return ""


#: The ops that allocate a tensor and write nothing in it.
_ALLOCATORS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
               torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
               torch.ops.aten.new_empty_strided.default, torch.ops.aten.empty_permuted.default}
#: Written outside torch: the name of the uncounted entry of an allocation read unwritten.
UNSEEN_WRITE = "written outside torch"


class Unfilled:
    """The storages the run allocated (``torch.empty``) that no dispatched op has written.
    Where an op reads one, or the model returns one, code outside the dispatcher filled it
    (a C extension writing through ``data_ptr``), doing work torch never saw. An argument
    that the schema marks as aliased (a view's input) or written is no read, nor is the
    input of an op that reads only its metadata (``empty_like``, ``new_zeros``). Partial
    writes are not told apart, and an extension writing into a tensor an op filled before is
    not seen."""

    def __init__(self) -> None:
        self.allocations: dict[int, tuple[torch.Tensor, str]] = {}
        """Storage -> the tensor allocated (held: its storage's address is not reused while
        it is listed) and where its allocation ran: ``node 'empty' in module 'ext'``."""

    def seen(self, func, named: dict, out, where: str) -> tuple[torch.Tensor, str] | None:
        """Follow one op: ``named`` its arguments by schema name, ``out`` its result, ``where``
        its node and module. The tensor it reads that hides work and why, else None."""
        schema = getattr(func, "_schema", None)
        reads_values = not _metadata_only(getattr(func, "_opname", ""))
        hidden = None
        for argument in schema.arguments if schema is not None else ():
            alias = argument.alias_info
            for value in _tensors(named.get(argument.name)):
                storage = storage_id(value)
                if alias is not None and alias.is_write:
                    self.allocations.pop(storage, None)
                elif alias is None and reads_values and storage in self.allocations:
                    hidden = hidden or (value, self.unwritten(storage, f"read by {where}"))
        if func in _ALLOCATORS and storage_id(out) is not None:
            self.allocations[storage_id(out)] = (out, where)
        return hidden

    def unwritten(self, storage: int, use: str) -> str:
        """Why ``storage``, allocated and never written by an op, hides work (once each)."""
        _, allocated = self.allocations.pop(storage)
        return (f"the tensor allocated at {allocated} is {use} though no op torch dispatched "
                f"wrote it: code outside torch (a C extension) filled it, and its work is not "
                f"counted. Make that code a torch custom op (torch.library) with a formula to "
                f"count it")


def _tensors(value) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _metadata_only(name: str) -> bool:
    """Whether the op named ``name`` reads only its tensor inputs' sizes and dtypes."""
    return name.endswith("_like") or name.startswith("new_")
