"""`exportflops.parallel.Layout`: the degrees checked once, the ranks they make and their mesh.
Expected ranks worked out from torchtitan's layout (torchtitan/distributed/parallel_dims.py,
``ParallelDims.build_mesh``: the world unflattened into (pp, dp_replicate, dp_shard, cp, tp),
tp innermost; the sparse mesh (pp, dp_replicate, efsdp, ep), ep innermost) and its constraint
(``ParallelDims._validate``: ep divides dp_shard x cp x tp)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from exportflops.errors import InputError
from exportflops.parallel import Layout

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")


def test_a_layouts_world_is_the_product_of_its_dense_degrees_expert_parallelism_borrowing():
    # 2 stages x 2 replicas x 2 shards x 2 ring places x 2 tensor ranks; ep 4 inside fsdp x cp
    # x tp = 8 adds none.
    assert Layout(pp=2, dp=2, fsdp=2, cp=2, tp=2, ep=4).world_size == 2 ** 5
    assert Layout().world_size == 1


def test_a_rank_is_placed_with_tp_innermost_then_cp_fsdp_dp_and_pp():
    layout = Layout(pp=2, fsdp=3, tp=4)
    # rank = (pp_i * fsdp + fsdp_i) * tp + tp_i: rank 17 = (1 * 3 + 1) * 4 + 1.
    assert (1 * 3 + 1) * 4 + 1 == 17
    at = layout.coordinates(17)
    assert (at["pp"], at["dp"], at["fsdp"], at["cp"], at["tp"]) == (1, 0, 1, 0, 1)


def test_a_ranks_groups_are_its_tensor_ranks_ring_fsdp_peers_and_expert_group():
    layout = Layout(fsdp=2, cp=2, tp=2)
    # rank 5 = (1 * 2 + 0) * 2 + 1: fsdp 1, cp 0, tp 1.
    assert layout.group(5, "tp") == [4, 5]
    assert layout.group(5, "cp") == [5, 7]  # a ring's places are tp = 2 apart
    assert layout.group(5, "fsdp") == [1, 5]  # the same cp and tp index
    assert layout.group(5, "fsdp", "cp") == [1, 3, 5, 7]  # FSDP2 over fsdp x cp, one tp index
    experts = Layout(fsdp=4, tp=2, ep=4)  # sparse (efsdp 8 / 4 = 2, ep 4), ep innermost
    assert experts.group(5, "ep") == [4, 5, 6, 7]
    assert experts.group(5, "efsdp") == [1, 5]  # every ep-th rank from 5 mod 4


def test_expert_parallelism_alone_is_ep_data_parallel_ranks_each_its_own_group():
    layout = Layout(dp=4, ep=4)
    assert layout.world_size == 4 and layout.group(2, "ep") == [0, 1, 2, 3]
    assert layout.group(2, "efsdp") == [2]
    # torchtitan's sparse mesh inside tp 4 without FSDP2: efsdp 4 / 2 = 2 groups of ep 2.
    assert Layout(tp=4, ep=2).group(3, "ep") == [2, 3]
    assert Layout(tp=4, ep=2).group(3, "efsdp") == [1, 3]


@pytest.mark.parametrize("degrees, words", [
    ({"tp": 0}, "tp is a degree, an int >= 1, got tp=0"),
    ({"fsdp": True}, "fsdp is a degree, an int >= 1, got fsdp=True"),
    ({"fsdp": 3, "ep": 2}, "ep 2 does not divide fsdp x cp x tp = 3"),
    ({"fsdp": 2, "tp": 4, "ep": 16}, "ep 16 does not divide fsdp x cp x tp = 8"),
    ({"tp": 4, "ep": 3}, "ep 3 does not divide dp x cp x tp (without fsdp) = 4"),
    ({"ep": 4}, "ep ranks alone, each running its own batch, are Layout(dp=4, ep=4)"),
], ids=["zero", "bool", "ep_not_dividing_fsdp", "ep_not_dividing_fsdp_tp", "ep_not_dividing_tp",
        "ep_without_ranks"])
def test_a_layout_refuses_degrees_that_do_not_fit_naming_the_field(degrees, words):
    with pytest.raises(InputError, match="Layout") as error:
        Layout(**degrees)
    assert words in str(error.value)


def test_a_layout_is_a_frozen_value_and_refuses_a_rank_or_dimension_it_lacks():
    layout = Layout(tp=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.tp = 4
    with pytest.raises(InputError, match=r"rank 2: Layout\(tp=2\) has ranks 0..1"):
        layout.coordinates(2)
    with pytest.raises(InputError, match="no mesh dimension 'sp'"):
        layout.group(0, "sp")
    with pytest.raises(InputError, match="not all on one mesh"):
        layout.group(0, "tp", "ep")


def test_a_layouts_mesh_has_the_dimensions_asked_under_a_fake_group_of_their_ranks():
    layout = Layout(pp=2, fsdp=2, tp=4)
    with layout.mesh(rank=5) as mesh:  # default: every dimension split more than once
        assert (mesh.mesh_dim_names, tuple(mesh.shape)) == (("pp", "fsdp", "tp"), (2, 2, 4))
        # torch places rank 5 where the layout does: 5 = (0 * 2 + 1) * 4 + 1.
        assert tuple(mesh.get_coordinate()) == (0, 1, 1)
        assert [layout.coordinates(5)[name] for name in mesh.mesh_dim_names] == [0, 1, 1]
    with layout.mesh("fsdp", "tp") as stage:  # one stage's group
        assert (stage.mesh_dim_names, stage.size()) == (("fsdp", "tp"), 8)
    assert not torch.distributed.is_initialized()  # the fake group is gone
