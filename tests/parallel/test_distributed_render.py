"""The rendered views of a parallelized model's rank: the summary's rank and collective bytes,
and the collectives view, checked against numbers derived by hand from the shapes of
tests/parallel_models.py (Megatron's MLP split at TP = 2)."""

from __future__ import annotations

import pytest
import torch

from exportflops import flops_report
from tests.parallel_models import BATCH, HIDDEN, SEQ
from tests.parallel.test_distributed import _rank_report

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4


@pytest.fixture(scope="module")
def rank1():
    return _rank_report(2, rank=1)


def test_collectives_view_lists_each_message_its_factor_and_time_at_a_link_bandwidth(rank1):
    text = flops_report(rank1, view="collectives", as_string=False, link_bytes_per_s=1e9)
    assert "Collectives of rank 1 of 2 (2;" in text
    rows = [line.split() for line in text.splitlines()[3:]]
    # down's forward all-reduce and up's backward all-reduce of the B x T x H float32 tensor:
    # 2 * 8 * 16 * 4 = 1024 bytes; ring all-reduce factor 2(n-1)/n = 1 at n = 2; time at 1 GB/s
    # 1024 * 1 / 1e9 s. The mesh's one dimension has no name: "-".
    message = BATCH * SEQ * HIDDEN * F32
    assert message == 1024
    assert rows[0] == ["all_reduce", "forward", "blocks.0.down", "-", "2", "float32", "1024",
                       "1.000", str(1024 * 1 / 1e9)]
    assert rows[1] == ["all_reduce", "backward", "blocks.0.up", "-", "2", "float32", "1024",
                       "1.000", str(1024 * 1 / 1e9)]
    assert rows[2][:2] + rows[2][-2:] == ["total", "forward", "1024", str(1024 / 1e9)]
    assert rows[3][:2] + rows[3][-2:] == ["total", "backward", "1024", str(1024 / 1e9)]


def test_without_a_bandwidth_the_view_has_no_time_column(rank1):
    text = flops_report(rank1, view="collectives")
    assert "time" not in text and "1.02 kB" in text  # 1024 bytes with a decimal prefix


def test_summary_names_the_rank_and_the_collective_bytes_per_phase(rank1):
    lines = flops_report(rank1, view="summary", as_string=False).splitlines()
    rank = next(line for line in lines if line.startswith("rank"))
    assert rank.split()[1:4] == ["1", "of", "2"]
    forward = next(line for line in lines if line.startswith("collective bytes, forward"))
    assert forward.split()[3:6] == ["1024", "1", "collective"]  # one all-reduce of 1024 B


def test_a_single_device_report_has_no_rank_line_and_an_empty_collectives_view():
    import exportflops

    report = exportflops.analyze(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    assert "rank" not in flops_report(report, view="summary")
    assert "none: rank 0 of 1 issues no collective" in flops_report(report, view="collectives")
