"""One parallel layout: the degrees of every split, checked once, the ranks they make and the one
device mesh every per-rank analysis builds from them (torchtitan's ``ParallelDims``,
torchtitan/distributed/parallel_dims.py).

The dense mesh is ``(pp, dp, fsdp, cp, tp)``, ``tp`` innermost, as ``ParallelDims.build_mesh``
unflattens the world (``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``): global rank

    rank = (((pp_i * dp + dp_i) * fsdp + fsdp_i) * cp + cp_i) * tp + tp_i

so a pipeline stage's ranks are consecutive, a ring's places are ``tp`` apart, and a rank's
FSDP2 peers share its tp index. Expert parallelism borrows ranks rather than adding them
(world = pp x dp x fsdp x cp x tp): inside FSDP2 its groups sit in the ``fsdp x cp x tp``
ranks of each (pp, dp) place, the sparse mesh ``(pp, dp, efsdp, ep)`` with ``ep`` innermost and
``efsdp = fsdp x cp x tp / ep`` ranks holding the same experts (``ParallelDims._validate``: ep
divides dp_shard x cp x tp). Without FSDP2 the groups sit in the dp x cp x tp ranks of a stage
(``Layout(dp=4, ep=4)``: four data-parallel ranks, each holding a quarter of the experts).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ..errors import LayoutError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: The dense mesh's dimensions, outermost first.
DENSE = ("pp", "dp", "fsdp", "cp", "tp")
#: The sparse (expert) mesh's dimensions, outermost first.
SPARSE = ("pp", "dp", "efsdp", "ep")


@dataclass(frozen=True)
class Layout:
    """The degree of each split: ``pp`` pipeline stages, ``dp`` replicated data-parallel ranks,
    ``fsdp`` FSDP2 shards, ``cp`` ranks of a context-parallel ring, ``tp`` tensor-parallel ranks,
    ``ep`` ranks of an expert-parallel group (module docstring). Checked when made."""

    pp: int = 1
    dp: int = 1
    fsdp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"Layout: {field.name} is a degree, an int >= 1, got "
                                 f"{field.name}={value!r}.")
        region = self._expert_region()
        if region % self.ep:
            over = "fsdp x cp x tp" if self.fsdp > 1 else "dp x cp x tp (without fsdp)"
            raise LayoutError(
                f"{self}: ep {self.ep} does not divide {over} = {region}, the ranks its groups "
                f"sit in as torchtitan lays them out (ParallelDims: ep divides dp_shard x cp x "
                f"tp); ep ranks alone, each running its own batch, are "
                f"Layout(dp={self.ep}, ep={self.ep}).")

    def __str__(self) -> str:
        given = [f"{name}={getattr(self, name)}" for name in (f.name for f in fields(self))
                 if getattr(self, name) > 1]
        return f"Layout({', '.join(given)})"

    @property
    def world_size(self) -> int:
        """The ranks: pp x dp x fsdp x cp x tp (expert parallelism borrows its ranks)."""
        return math.prod(getattr(self, name) for name in DENSE)

    def degrees(self, *names: str) -> dict[str, int]:
        """{dimension: degree} of ``names`` (default: the dense dimensions split more than
        once), outermost first; dimensions of the dense mesh or of the sparse one, not both."""
        mesh = self._mesh_of(names)
        if not names:
            names = tuple(name for name in DENSE if getattr(self, name) > 1)
        sizes = self._sizes(mesh)
        return {name: sizes[name] for name in mesh if name in names}

    def coordinates(self, rank: int) -> dict[str, int]:
        """Global ``rank``'s index along each dimension of the dense mesh, and ``efsdp`` and
        ``ep`` of the expert mesh ({"pp": ..., "tp": ..., "ep": ...})."""
        return {**self._placed(rank, SPARSE), **self._placed(rank, DENSE)}

    def group(self, rank: int, *dims: str) -> list[int]:
        """The ranks that differ from ``rank`` only along ``dims`` (one mesh's), in rank order:
        ``group(r, "tp")`` its tensor-parallel group, ``group(r, "fsdp", "cp")`` the ranks
        FSDP2 shards over with context parallelism, ``group(r, "ep")`` its expert group."""
        mesh = self._mesh_of(dims)
        sizes, at = self._sizes(mesh), self._placed(rank, mesh)
        strides = {name: math.prod(sizes[inner] for inner in mesh[i + 1:])
                   for i, name in enumerate(mesh)}
        first = rank - sum(at[name] * strides[name] for name in dims)
        return sorted(first + sum(i * strides[name] for i, name in zip(index, dims))
                      for index in itertools.product(*(range(sizes[name]) for name in dims)))

    def check_rank(self, rank: int) -> None:
        """``rank`` is one of this layout's: an int in 0 .. world_size - 1."""
        if isinstance(rank, bool) or not isinstance(rank, int) \
                or not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank!r}: {self} has ranks 0..{self.world_size - 1}.")

    def device_mesh(self, *dims: str, device_type: str = "cpu") -> DeviceMesh:
        """The DeviceMesh of ``dims`` (default: those split more than once, `degrees`) over the
        current process group, whose world must be their product: the whole layout, or one
        stage's (fsdp, tp) group."""
        from torch.distributed.device_mesh import init_device_mesh

        degrees = self.degrees(*dims)
        return init_device_mesh(device_type, tuple(degrees.values()),
                                mesh_dim_names=tuple(degrees))

    @contextlib.contextmanager
    def mesh(self, *dims: str, rank: int = 0, fake: bool = True,
             device_type: str = "cpu") -> Iterator[DeviceMesh]:
        """`device_mesh` of ``dims`` as ``rank`` of them (a rank of their own product, not a
        global rank): with ``fake``, inside `exportflops.fake_process_group` of that many
        ranks, destroyed on exit; else over the process group already set up."""
        from ..count.ranks import fake_process_group

        if not fake:
            yield self.device_mesh(*dims, device_type=device_type)
            return
        with fake_process_group(math.prod(self.degrees(*dims).values()), rank=rank):
            yield self.device_mesh(*dims, device_type=device_type)

    def _mesh_of(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The mesh holding every one of ``names``: the dense one, else the expert one."""
        unknown = [name for name in names if name not in DENSE + SPARSE]
        if unknown:
            raise LayoutError(f"{self}: no mesh dimension {unknown[0]!r}; the dense mesh is "
                             f"{', '.join(DENSE)}, the expert mesh {', '.join(SPARSE)}.")
        for mesh in (DENSE, SPARSE):
            if all(name in mesh for name in names):
                return mesh
        raise LayoutError(f"{self}: dimensions {', '.join(names)} are not all on one mesh: the "
                         f"dense mesh is {', '.join(DENSE)}, the expert mesh "
                         f"{', '.join(SPARSE)}.")

    def _expert_region(self) -> int:
        """The ranks of a (pp, dp) place an expert group sits in: fsdp x cp x tp, or without
        FSDP2 every rank of a stage, dp x cp x tp (module docstring)."""
        return (self.dp if self.fsdp == 1 else self.fsdp) * self.cp * self.tp

    def _sizes(self, mesh: tuple[str, ...]) -> dict[str, int]:
        """{dimension: degree} of ``mesh``; the expert mesh spans `_expert_region` in each
        (pp, dp) place, ep innermost."""
        if mesh == DENSE:
            return {name: getattr(self, name) for name in DENSE}
        return {"pp": self.pp, "dp": self.dp if self.fsdp > 1 else 1,
                "efsdp": self._expert_region() // self.ep, "ep": self.ep}

    def _placed(self, rank: int, mesh: tuple[str, ...]) -> dict[str, int]:
        """Global ``rank``'s index along each dimension of ``mesh``, the last innermost."""
        self.check_rank(rank)
        sizes, placed = self._sizes(mesh), {}
        for name in reversed(mesh):
            rank, placed[name] = divmod(rank, sizes[name])
        return placed
