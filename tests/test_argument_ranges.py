"""An argument out of its range is the library's `InputError`, raised by the function that
takes it before any work and naming the argument as it is passed (``new_tokens=0``), with the
range it takes: generation's new tokens, cache and static cache length, the profiler's and the
measured pipeline's iterations, the link bandwidth of every timed collective. The command
reaches the same checks (tests/cli/test_cli_options.py).
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze_generation, profile
from exportflops.errors import InputError
from exportflops.parallel.pipeline import analyze_pipeline
from exportflops.records import Collective
from exportflops.render.collectives import collectives_view
from exportflops.render.format import Style

IDS = torch.zeros(1, 4, dtype=torch.long)


def _layers() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))


@pytest.mark.parametrize(("options", "message"), [
    (dict(new_tokens=0), r"new_tokens=0: a request generates a count of new tokens >= 1 .* "
                         r"pass new_tokens=N with N >= 1"),
    (dict(new_tokens=2.0), r"new_tokens=2\.0: "),
    (dict(new_tokens=True), r"new_tokens=True: "),
    (dict(new_tokens=2, cache="paged"), r"cache='paged': .* \('dynamic'\) .* \('static'\)"),
    (dict(new_tokens=2, cache="static", max_cache_len=0),
     r"max_cache_len=0: a static cache holds a count of entries >= 1; pass max_cache_len=N"),
    (dict(new_tokens=2, max_cache_len=8), r"max_cache_len= sizes a static cache: it needs "
                                          r"cache='static'; pass new_tokens=2 cache='static' "
                                          r"max_cache_len=8\."),
], ids=["zero-tokens", "float-tokens", "bool-tokens", "unknown-cache", "zero-cache-entries",
        "length-of-a-dynamic-cache"])
def test_generation_refuses_an_argument_out_of_range_before_looking_at_the_model(options,
                                                                                 message):
    # A Linear has no cache: past the argument checks it would be a GenerationError.
    with pytest.raises(InputError, match=message):
        analyze_generation(torch.nn.Linear(4, 4), IDS, **options)


@pytest.mark.parametrize(("warmup", "repeat"), [(-1, 5), (0, 0)], ids=["warmup", "repeat"])
def test_the_profile_iterations_are_an_input_error_naming_both(warmup, repeat):
    with pytest.raises(InputError, match=rf"profile\(\) needs integers warmup >= 0 and repeat "
                                         rf">= 1, got warmup={warmup}, repeat={repeat}: pass "
                                         rf"warmup= the untimed iterations"):
        profile(_layers(), (torch.randn(2, 4),), warmup=warmup, repeat=repeat)


def test_a_measured_pipeline_checks_its_iterations_before_counting_a_stage():
    # A model that cannot be split (no layers to split by) would fail later, in the split.
    with pytest.raises(InputError, match=r"analyze_pipeline\(measure=True\) needs integers "
                                         r"warmup >= 0 and repeat >= 1, got warmup=0, repeat=0"):
        analyze_pipeline(torch.nn.Linear(4, 4), (torch.randn(2, 4),), stages=2, measure=True,
                         warmup=0, repeat=0, device=None)


@pytest.mark.parametrize("link", [0, -50e9, float("inf"), True],
                         ids=["zero", "negative", "infinite", "bool"])
def test_a_pipeline_refuses_a_link_that_is_no_bandwidth_before_counting(link):
    with pytest.raises(InputError, match=r"link_bytes_per_s=.*: a collective's time is its bytes "
                                         r"over the link's bus bandwidth, in bytes/s > 0"):
        analyze_pipeline(torch.nn.Linear(4, 4), (torch.randn(2, 4),), stages=2,
                         link_bytes_per_s=link)


def test_a_collective_timed_at_no_bandwidth_is_an_input_error_not_a_division_by_zero():
    # 1 MB all-reduced over 2 ranks: 2 (2 - 1) / 2 = 1, so 1e6 bytes at 1e9 B/s is 1 ms.
    reduce = Collective(op="all_reduce", bytes=10**6, dtype="float32", phase="forward",
                        group_size=2, group="tp", module="", node="all_reduce",
                        torch_op="_c10d_functional.all_reduce.default", bandwidth_factor=1.0)
    assert reduce.seconds(1e9) == pytest.approx(1e-3)
    with pytest.raises(InputError, match=r"link_bytes_per_s=0"):
        reduce.seconds(0)
    with pytest.raises(InputError, match=r"link_bytes_per_s=-1000000000\.0: "):
        collectives_view(_report_with(reduce), Style(), link_bytes_per_s=-1e9)


def _report_with(collective: Collective):
    from exportflops import analyze

    report = analyze(torch.nn.Linear(4, 4, device="meta"), (torch.randn(2, 4, device="meta"),))
    return report.model_copy(update={"collectives": [collective]})
