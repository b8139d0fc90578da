"""The runtime pass: every counted node timed, module latencies that add up along the
tree, the plain forward beside the timed replay, MFU, the training-loop profiler, and the errors.

Timing tests assert properties (orderings, sums, what was run how often), never speeds: the CI
machine is shared. The arithmetic of the record (medians, overhead, residual, rates) is checked on
hand-set samples. Counts are derived by hand in the tests."""

from __future__ import annotations

import math
import time
import warnings

import pytest
import torch
from torch import nn

from exportflops import ExportError, Report, analyze, profile
from exportflops.roofline import devices
from exportflops.runtime import timing
from exportflops.runtime.measured import runtime_profile
from exportflops.errors import ProfileError
from exportflops.runtime.profiler import FlopsProfiler

B, IN, HIDDEN, OUT = 8, 32, 64, 10
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Residual(nn.Module):
    """x + relu(fc(x)): a child module and an add of its own."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):  # (B, d)
        return x + torch.relu(self.fc(x))


class Net(nn.Module):
    """Two residual blocks, a head, and a softmax the root runs itself: three levels of tree,
    with own (exclusive) work at the root and in the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Residual(IN), Residual(IN))
        self.head = nn.Linear(IN, OUT)

    def forward(self, x):  # (B, IN) -> (B, OUT)
        return self.head(self.blocks(x)).softmax(-1)


def net() -> Net:
    torch.manual_seed(0)
    return Net()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread while timing on a shared machine: a small op then runs inline instead
    of waking a thread pool that other processes may have descheduled, which turns microseconds
    into milliseconds at random and buries the properties below in noise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def profiled(one_thread) -> Report:
    return profile(net(), (torch.randn(B, IN),), warmup=2, repeat=9, peak_flop_per_s=False)


def parent(path: str) -> str | None:
    return None if path == "" else path.rpartition(".")[0]


def with_ancestors(path: str) -> set[str]:
    paths = {path}
    while (path := parent(path)) is not None:
        paths.add(path)
    return paths


# --- per node and per module -------------------------------------------------------------------

def test_every_counted_node_is_timed_once_in_graph_order(profiled):
    timed = profiled.runtime.nodes
    assert [t.name for t in timed] == [n.name for n in profiled.nodes]
    assert [t.module for t in timed] == [n.module for n in profiled.nodes]


def test_node_latencies_are_positive_and_min_median_max_are_ordered(profiled):
    for t in profiled.runtime.nodes:
        assert 0 < t.latency.min_s <= t.latency.median_s <= t.latency.max_s, t.name


def test_modules_with_a_timed_node_are_listed_parents_first(profiled):
    ran = set().union(*(with_ancestors(t.module) for t in profiled.runtime.nodes))
    listed = [m.path for m in profiled.runtime.modules]
    assert set(listed) == ran and len(listed) == len(ran)
    assert all(listed.index(parent(p)) < listed.index(p) for p in listed if p)


def test_module_latency_is_its_own_nodes_plus_its_children(profiled):
    runtime = profiled.runtime
    inclusive = {m.path: m.inclusive_s for m in runtime.modules}
    for m in runtime.modules:
        own = sum(t.latency.median_s for t in runtime.nodes if t.module == m.path)
        children = sum(s for p, s in inclusive.items() if p and parent(p) == m.path)
        assert math.isclose(m.exclusive_s, own, rel_tol=1e-9, abs_tol=1e-15), m.path
        assert math.isclose(m.inclusive_s, own + children, rel_tol=1e-9), m.path
    # The blocks and the root run ops of their own (add, softmax), so exclusive is not empty.
    assert inclusive[""] > inclusive["blocks"] > 0 and runtime.modules[0].exclusive_s > 0


# --- plain forward, overhead, residual ---------------------------------------------------------

def test_plain_end_to_end_and_overhead_are_present_and_non_negative(profiled):
    runtime = profiled.runtime
    assert runtime.plain_total.median_s > 0
    # On a model this small the interpreter's per-node Python costs more than the ops: a
    # negative overhead would mean the two runs were swapped or the plain one is not plain.
    assert runtime.overhead_s >= 0
    assert runtime.timer.startswith("time.perf_counter_ns around each node")
    assert "plain forward: the model's own forward" in runtime.timer


# A custom op that sleeps for a schedule of durations, one per iteration: the plain forward and
# the timed replay each call it once per iteration, so call // 2 is the iteration.
SLEEP_MS = {"schedule": [], "calls": 0}


@torch.library.custom_op("exportflops_tests::scheduled_sleep", mutates_args=())
def scheduled_sleep(x: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_MS["schedule"][SLEEP_MS["calls"] // 2] / 1e3)
    SLEEP_MS["calls"] += 1
    return x.clone()


@scheduled_sleep.register_fake
def _(x):
    return torch.empty_like(x)


class Sleeper(nn.Module):
    def forward(self, x):
        return torch.ops.exportflops_tests.scheduled_sleep(x)


def test_latency_is_median_min_and_max_over_the_measured_repeats_only():
    """One warm-up iteration of 150 ms, then 5, 5, 30, 45, 60 ms: the median is 30 ms (the
    mean would be 29), min 5, max 60; a warm-up counted would make the max 150. The bounds
    allow a sleep to overshoot by up to 15 ms on a loaded machine."""
    SLEEP_MS.update(schedule=[150, 5, 5, 30, 45, 60], calls=0)
    report = profile(Sleeper(), (torch.ones(2),), warmup=1, repeat=5, peak_flop_per_s=False)
    assert SLEEP_MS["calls"] == 2 * 6
    (sleep,) = [t.latency for t in report.runtime.nodes
                if t.name in {n.name for n in report.nodes if "scheduled_sleep" in n.op}]
    assert 5e-3 <= sleep.min_s < 30e-3
    assert 30e-3 <= sleep.median_s < 45e-3
    assert 60e-3 <= sleep.max_s < 150e-3
    assert 30e-3 <= report.runtime.plain_total.median_s < 45e-3


# --- achieved FLOPS and MFU --------------------------------------------------------------------

def test_the_user_peak_is_the_peak():
    report = profile(net(), (torch.randn(B, IN),), warmup=0, repeat=1, peak_flop_per_s=1e12)
    assert report.runtime.peak_flop_per_s == 1e12 and report.runtime.peak_source == "user"


def test_the_cpu_estimate_is_the_peak_when_the_user_gives_none(monkeypatch):
    """threads x 2.5 GHz x 32 FLOP/cycle: AVX2 has 8 float32 lanes, x 2 FMA units x 2 FLOPs."""
    monkeypatch.setattr(devices, "cpu_clock_ghz", lambda: (2.5, "test clock"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    report = profile(net(), (torch.randn(B, IN),), warmup=1, repeat=3)
    assert report.runtime.peak_flop_per_s == torch.get_num_threads() * 2.5e9 * 8 * 2 * 2
    assert report.runtime.peak_source.startswith("estimate, not a datasheet figure")


def test_peak_flop_per_s_false_measures_without_mfu(profiled):
    assert profiled.runtime.mfu is None and profiled.runtime.peak_flop_per_s is None
    assert profiled.runtime.peak_source == "none (peak_flop_per_s=False)"


@pytest.mark.parametrize("peak", [0, -1e12, True, float("nan"), "1e12"],
                         ids=["zero", "negative", "bool", "nan", "string"])
def test_peak_flop_per_s_must_be_a_positive_rate(peak):
    with pytest.raises(ValueError, match="peak_flop_per_s is a dense peak in FLOP/s"):
        profile(net(), (torch.randn(B, IN),), repeat=1, peak_flop_per_s=peak)


@pytest.mark.parametrize(("warmup", "repeat"), [(-1, 5), (0, 0), (0, 2.5), (True, 5)],
                         ids=["warmup", "repeat", "float", "bool"])
def test_warmup_and_repeat_are_checked(warmup, repeat):
    with pytest.raises(ValueError, match="warmup >= 0 and repeat >= 1"):
        profile(net(), (torch.randn(B, IN),), warmup=warmup, repeat=repeat)


# --- the report --------------------------------------------------------------------------------

def test_a_report_with_runtime_round_trips_through_json(profiled):
    assert Report.model_validate_json(profiled.model_dump_json()) == profiled


def test_the_counts_are_analyze_s(profiled):
    # profile times the program of one full export: its report is that export's, node for
    # node; the fast path (Net's two blocks traced once) names a repeated block's nodes by the
    # block ("blocks.1:linear") and counts the same, module for module
    counted = profiled.model_copy(update={"runtime": None})
    assert counted == analyze(net(), (torch.randn(B, IN),), fast=False)
    fast = analyze(net(), (torch.randn(B, IN),))
    assert (counted.total, counted.modules) == (fast.total, fast.modules)
    assert [n.cost for n in counted.nodes] == [n.cost for n in fast.nodes]


def test_a_report_is_timed_on_its_program_without_re_export(monkeypatch):
    model, x = net(), torch.randn(B, IN)
    program = torch.export.export(model, (x,))
    report = analyze(program)

    def no_export(*args, **kwargs):
        raise AssertionError("profile(report) exported again")

    monkeypatch.setattr(torch.export, "export", no_export)
    timed = profile(report, (x,), program=program, warmup=1, repeat=2, peak_flop_per_s=False)
    assert timed.model_copy(update={"runtime": None}) == report
    assert [t.name for t in timed.runtime.nodes] == [n.name for n in report.nodes]
    assert "plain forward: program.module()" in timed.runtime.timer


def test_a_saved_program_is_timed_on_its_example_inputs(tmp_path):
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net(), (torch.randn(B, IN),)), path)
    report = profile(path, warmup=1, repeat=2, peak_flop_per_s=False)
    assert report.model == str(path)
    assert [t.name for t in report.runtime.nodes] == [n.name for n in report.nodes]


def test_a_report_without_its_program_is_refused():
    report = analyze(net(), (torch.randn(B, IN),))
    with pytest.raises(ProfileError, match=r"The report of Net is data and holds no graph.*"
                                           r"program=exported_program"):
        profile(report, (torch.randn(B, IN),))


def test_a_report_of_another_program_is_refused():
    report = analyze(net(), (torch.randn(B, IN),))
    other = torch.export.export(nn.Linear(IN, OUT), (torch.randn(B, IN),))
    with pytest.raises(ProfileError, match="The report of Net was not analyzed from this program"):
        profile(report, program=other)


def test_a_report_with_dynamic_sizes_asks_for_one_size():
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(net(), (torch.randn(B, IN),),
                                  dynamic_shapes=({0: batch},))
    with pytest.raises(ProfileError, match=r"expressions of dynamic sizes.*report.evaluate"):
        profile(program, (torch.randn(B, IN),))


# --- the caller's state ------------------------------------------------------------------------

class Noisy(nn.Module):
    """Batch-norm statistics and dropout: state a run changes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(IN, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(HIDDEN, OUT)

    def forward(self, x):  # (B, IN) -> (B, OUT)
        return self.out(self.drop(torch.relu(self.bn(self.fc(x)))))


def test_profile_leaves_buffers_rng_and_inputs_as_they_were():
    torch.manual_seed(0)
    model, x = Noisy(), torch.randn(B, IN)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    rng, x_before = torch.get_rng_state(), x.clone()
    profile(model, (x,), warmup=1, repeat=2, peak_flop_per_s=False)
    assert all(torch.equal(buffers[k], v) for k, v in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(x, x_before)


class DoublesInPlace(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_an_input_written_in_place_is_fresh_for_every_run():
    x = torch.ones(3)
    profile(DoublesInPlace(), (x,), warmup=1, repeat=3, peak_flop_per_s=False)
    assert torch.equal(x, torch.ones(3))  # 2**8 after the 8 runs if they shared it


# --- errors ------------------------------------------------------------------------------------

def test_a_model_on_meta_is_refused_with_what_to_do():
    with torch.device("meta"):
        model = Net()
    with pytest.raises(ProfileError, match=r"Net's parameters are on the meta device "
                                           r"\(blocks.0.fc.weight .*model.to_empty"):
        profile(model, (torch.randn(B, IN, device="meta"),), repeat=1)


def test_inputs_on_meta_are_refused():
    with pytest.raises(ProfileError, match=r"input args\[0\] of Net is on the meta device"):
        profile(net(), (torch.randn(B, IN, device="meta"),), repeat=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_cuda_request_without_cuda_says_so():
    with pytest.raises(ProfileError, match=r"device='cuda' asks for CUDA, but "
                                           r"torch.cuda.is_available\(\) is False.*device='cpu'"):
        profile(net(), (torch.randn(B, IN),), device="cuda")


def test_something_else_than_a_model_program_or_report_is_refused():
    with pytest.raises(TypeError, match="profile.. takes an nn.Module.*got int"):
        profile(3, (torch.randn(B, IN),))


# --- CUDA: the event path (skips without a GPU) ------------------------------------------------

class StandInEvent:
    """Stands in for torch.cuda.Event on any machine and, like it, cannot be read before a
    synchronize that follows its record()."""

    synchronizes = 0

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        self.at, self.recorded_after = None, None

    def record(self) -> None:
        self.at, self.recorded_after = time.perf_counter(), StandInEvent.synchronizes

    def elapsed_time(self, end: StandInEvent) -> float:
        assert StandInEvent.synchronizes > end.recorded_after, "read before its synchronize"
        return (end.at - self.at) * 1e3  # milliseconds, as CUDA's


def test_the_cuda_clock_reads_its_events_after_one_synchronize_per_iteration(monkeypatch):
    """The event path, checked without a GPU: 2 warm-up + 3 measured iterations make 5
    synchronizes, plus 1 after the clock's calibration; every event is read after one."""
    def synchronize():
        StandInEvent.synchronizes += 1

    monkeypatch.setattr(StandInEvent, "synchronizes", 0)
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    model, x = net(), torch.randn(B, IN)
    graph_module = torch.export.export(model, (x,)).module()
    nodes = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    samples = timing.measure(graph_module, nodes, lambda: ((x,), {}, [x]), model,
                             torch.device("cuda", 0), warmup=2, repeat=3)
    assert StandInEvent.synchronizes == 2 + 3 + 1
    assert samples.clock.startswith("a pair of torch.cuda.Event per node")
    assert list(samples.nodes) == [n.name for n in nodes]
    assert [len(s) for s in samples.nodes.values()] == [3] * len(nodes)
    assert len(samples.plain) == len(samples.hooked) == 3
    assert all(s >= 0 for seconds in samples.nodes.values() for s in seconds)


@needs_cuda
def test_cuda_events_time_every_node():
    model, x = net().cuda(), torch.randn(B, IN, device="cuda")
    report = profile(model, (x,), device="cuda", warmup=2, repeat=5, peak_flop_per_s=False)
    runtime = report.runtime
    assert runtime.timer.startswith("a pair of torch.cuda.Event per node")
    assert runtime.device.startswith("cuda:")
    assert [t.name for t in runtime.nodes] == [n.name for n in report.nodes]
    # A view launches no kernel: its two events can read the same time, so 0 is allowed here.
    assert all(0 <= t.latency.min_s <= t.latency.median_s <= t.latency.max_s
               for t in runtime.nodes)
    assert runtime.plain_total.median_s > 0


@needs_cuda
def test_cuda_synchronizes_once_per_iteration_never_per_node(monkeypatch):
    """3 warm-up + 4 measured iterations: 7 synchronizes, plus 1 after the clock's calibration;
    one per node would make it 8 + 7 x (number of nodes)."""
    calls = []
    synchronize = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda *args: (calls.append(1), synchronize(*args))[1])
    model, x = net().cuda(), torch.randn(B, IN, device="cuda")
    profile(model, (x,), device="cuda", warmup=3, repeat=4, peak_flop_per_s=False)
    assert len(calls) == 3 + 4 + 1


@needs_cuda
def test_inputs_on_another_device_than_the_parameters_are_refused():
    with pytest.raises(ProfileError, match=r"input args\[0\] is on cuda:0 but Net's parameters "
                                           r"are on cpu: move the inputs with .to\('cpu'\)"):
        profile(net(), (torch.randn(B, IN, device="cuda"),), repeat=1)


@needs_cuda
def test_parameters_on_two_devices_are_refused():
    model = net()
    model.head.cuda()
    with pytest.raises(ProfileError, match=r"Net's parameters and buffers are on several "
                                           r"devices.*model.to\(device\)"):
        profile(model, (torch.randn(B, IN),), repeat=1)


@needs_cuda
def test_cuda_asked_for_a_model_on_the_cpu_is_refused():
    with pytest.raises(ProfileError, match=r"device='cuda:0' was asked, but Net and its inputs "
                                           r"are on cpu"):
        profile(net(), (torch.randn(B, IN),), device="cuda:0", repeat=1)


# --- the training-loop profiler ----------------------------------------------------------------

class Scaled(nn.Module):
    """fc2(relu(fc1(x))) * scale, with ``scale`` passed by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT)

    def forward(self, x, *, scale):  # (b, IN), (b, 1) -> (b, OUT)
        return self.fc2(torch.relu(self.fc1(x))) * scale


def batches(steps: int) -> list[dict]:
    """Batches of 4, 5, 6, ... rows, drawn from their own generator so that the model's use of
    the global RNG (dropout) cannot shift them."""
    g = torch.Generator().manual_seed(1)
    return [dict(x=torch.randn(4 + s, IN, generator=g), scale=torch.rand(4 + s, 1, generator=g))
            for s in range(steps)]


def train(model: nn.Module, steps: int = 6, profile_at: int | None = None,
          profiler: FlopsProfiler | None = None) -> list[float]:
    """SGD with the profiler started before the forward of step ``profile_at`` and ended after it,
    as DeepSpeed's FlopsProfiler is used. Returns the losses."""
    torch.manual_seed(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step, batch in enumerate(batches(steps)):
        if step == profile_at:
            profiler.start()
        loss = model(batch["x"], scale=batch["scale"]).square().mean()
        if step == profile_at:
            profiler.stop()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def hooks_and_attributes(model: nn.Module) -> list:
    """Every hook dict (forward, backward, state-dict, ...) and attribute name of every module."""
    return [(path, sorted(vars(m)),
             {k: dict(v) for k, v in vars(m).items() if "hook" in k and isinstance(v, dict)})
            for path, m in model.named_modules()]


def test_training_loop_profiler_started_at_step_3_counts_the_real_forward():
    """Step 3 has 4 + 3 = 7 rows. MACs: 7 x (IN x HIDDEN + HIDDEN x OUT) = 7 x (2,048 + 640)
    = 18,816. FLOPs: 2 per MAC, plus one per output element for each bias add (7 x 64, 7 x 10),
    the ReLU (7 x 64) and the product by scale (7 x 10)."""
    model = Scaled()
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flop_per_s=False)
    train(model, profile_at=3, profiler=profiler)
    assert [spec.shape for spec in profiler.report.inputs] == [[7, IN], [7, 1]]
    assert profiler.get_total_macs() == 7 * (IN * HIDDEN + HIDDEN * OUT) == 18_816
    assert profiler.get_total_flops() == 2 * 18_816 + 7 * HIDDEN + 7 * OUT + 7 * HIDDEN + 7 * OUT
    assert profiler.get_total_params() == IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT
    assert profiler.get_total_duration() == profiler.report.runtime.plain_total.median_s > 0
    profiler.end()


def test_the_profiled_step_leaves_the_model_and_its_training_unchanged():
    """A twin trained on the same batches without the profiler ends with the same losses,
    parameters and batch-norm statistics; dropout draws the same masks."""

    class NoisyScaled(Noisy):
        def forward(self, x, *, scale):
            return super().forward(x) * scale

    torch.manual_seed(0)
    model = NoisyScaled()
    twin = NoisyScaled()
    twin.load_state_dict(model.state_dict())
    before = hooks_and_attributes(model)
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flop_per_s=False)
    losses = train(model, profile_at=3, profiler=profiler)
    profiler.end()
    assert losses == train(twin)
    assert hooks_and_attributes(model) == before
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 twin.state_dict().values()))


class Fails(nn.Module):
    def forward(self, x):
        raise RuntimeError("bad batch")


def test_a_forward_that_raises_removes_the_hooks_and_profiles_nothing():
    model = Fails()
    before = hooks_and_attributes(model)
    profiler = FlopsProfiler(model).start()
    with pytest.raises(RuntimeError, match="bad batch"):
        model(torch.ones(1))
    assert hooks_and_attributes(model) == before
    with pytest.raises(RuntimeError, match="FlopsProfiler has no profile yet"):
        profiler.get_total_flops()


def test_stopped_before_the_forward_nothing_is_profiled():
    model = Scaled()
    before = hooks_and_attributes(model)
    with FlopsProfiler(model) as profiler:
        profiler.start()
        assert hooks_and_attributes(model) != before  # the hooks are in place while started
        profiler.stop()
        model(torch.ones(2, IN), scale=torch.ones(2, 1))
    assert hooks_and_attributes(model) == before
    with pytest.raises(RuntimeError, match="call start.. before the model's forward"):
        profiler.get_total_macs()


def test_start_twice_without_stop_is_refused():
    profiler = FlopsProfiler(Scaled()).start()
    with pytest.raises(RuntimeError, match="start.. was called twice without stop"):
        profiler.start()
    profiler.end()


def test_print_model_profile_writes_what_it_returns(tmp_path):
    model = Scaled()
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flop_per_s=False).start()
    model(torch.ones(2, IN), scale=torch.ones(2, 1))
    out = tmp_path / "profile.txt"
    text = profiler.print_model_profile(output_file=out)
    profiler.end()
    assert out.read_text() == text and "fc1" in text


class DataDependent(nn.Module):
    """Reads its input's data through numpy unless told not to: torch.export refuses it (a
    branch on a value, with real tensors, the example's values would decide)."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = True

    def forward(self, x):
        if self.branches:
            return torch.from_numpy(x.numpy() * 2)
        return x * 2


def test_a_failed_export_in_the_profiled_step_keeps_the_step_and_raises_on_reading():
    """The step's forward returns its output; the export failure is kept, warned about, and
    raised as the cause of a ProfileError by every reading of the counts."""
    model, x = DataDependent(), torch.ones(3)
    profiler = FlopsProfiler(model, warmup=0, repeat=1, peak_flop_per_s=False).start()
    with pytest.warns(RuntimeWarning, match="could not profile DataDependent's forward"):
        out = model(x)
    assert torch.equal(out, torch.full((3,), 2.0))
    readings = [profiler.get_total_flops, profiler.get_total_macs, profiler.get_total_duration,
                lambda: profiler.report]
    for read in readings:
        with pytest.raises(ProfileError, match=r"profiling DataDependent's forward failed "
                                               r"\(the training step ran as usual.*\) with "
                                               r"ExportError: torch.export could not") as e:
            read()
        assert isinstance(e.value.__cause__, ExportError)
    profiler.end()


def test_a_new_start_forgets_the_last_failure():
    """After a failed step, the next profiled step that exports counts its 3 products."""
    model, x = DataDependent(), torch.ones(3)
    profiler = FlopsProfiler(model, warmup=0, repeat=1, peak_flop_per_s=False)
    with pytest.warns(RuntimeWarning):
        profiler.start()
        model(x)
    model.branches = False
    profiler.start()
    model(x)
    profiler.end()
    assert profiler.get_total_flops() == 3


# --- the record, from hand-set samples ---------------------------------------------------------

def two_layers() -> Report:
    """Linear(4, 3) then ReLU on 2 rows. linear: 2 x 4 x 3 = 24 MACs, 2 x 24 + 2 x 3 (bias)
    = 54 FLOPs, in module "0"; relu: 2 x 3 = 6 FLOPs, in module "1"."""
    torch.manual_seed(0)
    return analyze(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), (torch.randn(2, 4),))


def record(report: Report, linear: list[float], relu: list[float], *, plain: list[float],
           hooked: list[float], peak: float | None = None):
    names = [n.name for n in report.nodes]
    samples = timing.Samples(dict(zip(names, [linear, relu])), hooked, plain, "hand-set")
    return runtime_profile(report, samples, None if peak is None else devices.Peak(peak, "user"),
                           device="cpu (hand)", timer="hand-set", warmup=4)


def test_the_record_of_hand_set_samples():
    report = two_layers()
    assert [(n.module, n.cost.flops) for n in report.nodes] == [("0", 54), ("1", 6)]
    runtime = record(report, [1e-3, 3e-3, 2e-3], [4e-4, 1e-4, 1e-4],
                     plain=[3e-3, 5e-3, 4e-3], hooked=[6e-3, 7e-3, 5e-3], peak=1e5)
    linear, relu = runtime.nodes
    # The median of three is the middle one, 2e-3; the mean (2e-3 too) is not what tells them
    # apart: relu's median is 1e-4 where its mean would be 2e-4.
    assert (linear.latency.median_s, linear.latency.min_s, linear.latency.max_s) == \
        (2e-3, 1e-3, 3e-3)
    assert relu.latency.median_s == 1e-4
    assert linear.achieved_flop_per_s == pytest.approx(54 / 2e-3)  # 27,000 FLOP/s
    assert linear.mfu == pytest.approx(27_000 / 1e5)
    modules = {m.path: m for m in runtime.modules}
    assert modules["0"].inclusive_s == modules["0"].exclusive_s == 2e-3
    assert modules[""].inclusive_s == pytest.approx(2e-3 + 1e-4)  # the two children
    assert modules[""].exclusive_s == 0  # the root runs no op of its own
    assert modules[""].achieved_flop_per_s == pytest.approx(60 / 2.1e-3)
    assert runtime.overhead_s == pytest.approx(6e-3 - 4e-3)  # timed replay minus plain
    assert runtime.residual_s == pytest.approx(4e-3 - (2e-3 + 1e-4))  # plain minus the nodes
    assert runtime.achieved_flop_per_s == pytest.approx(60 / 4e-3)  # 15,000 FLOP/s
    assert runtime.mfu == pytest.approx(15_000 / 1e5)
    assert (runtime.warmup, runtime.repeat) == (4, 3)


def test_a_residual_or_overhead_below_zero_is_kept_not_clamped():
    """Nodes that sum to more than the plain forward (noise on a tiny model), and a timed
    replay faster than the plain one: both differences stay negative."""
    runtime = record(two_layers(), [3e-3] * 3, [1e-3] * 3, plain=[2e-3] * 3, hooked=[1e-3] * 3)
    assert runtime.residual_s == pytest.approx(2e-3 - (3e-3 + 1e-3))
    assert runtime.overhead_s == pytest.approx(1e-3 - 2e-3)


def test_a_node_with_a_zero_median_has_no_rate():
    """A view launches no kernel on CUDA: its two events can read the same time."""
    runtime = record(two_layers(), [1e-3] * 3, [0.0, 0.0, 1e-4], plain=[2e-3] * 3,
                     hooked=[3e-3] * 3, peak=1e5)
    relu = runtime.nodes[1]
    assert relu.latency.median_s == 0
    assert relu.achieved_flop_per_s is None and relu.mfu is None


def test_without_a_peak_there_is_no_mfu_but_a_rate():
    runtime = record(two_layers(), [1e-3] * 3, [1e-3] * 3, plain=[2e-3] * 3, hooked=[3e-3] * 3)
    assert runtime.achieved_flop_per_s == pytest.approx(60 / 2e-3)
    assert runtime.mfu is None and runtime.nodes[0].mfu is None
    assert runtime.peak_source == "none (peak_flop_per_s=False)"


# --- peak_flop_per_s and its deprecated name ---------------------------------------------------

def test_peak_flops_is_a_deprecated_name_of_peak_flop_per_s():
    with pytest.warns(DeprecationWarning, match="peak_flops= is deprecated, pass "
                                                "peak_flop_per_s="):
        report = profile(net(), (torch.randn(B, IN),), warmup=0, repeat=1, peak_flops=1e12)
    assert report.runtime.peak_flop_per_s == 1e12


def test_the_deprecation_warning_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FlopsProfiler(Scaled(), peak_flops=False)
    (warning,) = [w for w in caught if w.category is DeprecationWarning]
    assert warning.filename == __file__


@pytest.mark.parametrize("make", [
    lambda: profile(net(), (torch.randn(B, IN),), peak_flop_per_s=1e12, peak_flops=1e12),
    lambda: FlopsProfiler(Scaled(), peak_flop_per_s=False, peak_flops=False),
], ids=["profile", "FlopsProfiler"])
def test_both_peak_names_at_once_are_refused(make):
    with pytest.raises(TypeError, match="both peak_flop_per_s= and peak_flops="):
        make()


# --- inputs the program was not exported for ----------------------------------------------------

@pytest.fixture(scope="module")
def program_of_net() -> torch.export.ExportedProgram:
    return torch.export.export(net(), (torch.randn(B, IN),))


def test_inputs_of_another_shape_are_refused_before_running(program_of_net):
    with pytest.raises(ProfileError, match=r"input args\[0\] of ExportedProgram has shape "
                                           r"\[5, 32\], but the program was exported for "
                                           r"\[8, 32\]: export it with inputs of these shapes "
                                           r"\(or with dynamic_shapes="):
        profile(program_of_net, (torch.randn(5, IN),), repeat=1, peak_flop_per_s=False)


def test_a_saved_program_given_inputs_of_another_shape_is_refused(tmp_path, program_of_net):
    path = tmp_path / "net.pt2"
    torch.export.save(program_of_net, path)
    with pytest.raises(ProfileError, match=rf"input args\[0\] of {path} has shape \[8, 31\]"):
        profile(path, (torch.randn(B, IN - 1),), repeat=1, peak_flop_per_s=False)


def test_inputs_of_another_dtype_are_refused(program_of_net):
    with pytest.raises(ProfileError, match=r"input args\[0\] of ExportedProgram has dtype "
                                           r"torch.float64, but the program was exported for "
                                           r"torch.float32"):
        profile(program_of_net, (torch.randn(B, IN, dtype=torch.float64),), repeat=1,
                peak_flop_per_s=False)


def test_inputs_of_another_structure_are_refused(program_of_net):
    with pytest.raises(ProfileError, match="do not have the structure the program was exported "
                                           "with: pass the arguments it was exported with"):
        profile(program_of_net, (torch.randn(B, IN), torch.randn(B, IN)), repeat=1,
                peak_flop_per_s=False)


def test_a_dynamic_size_outside_its_range_is_refused():
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(net(), (torch.randn(B, IN),), dynamic_shapes=({0: batch},))
    report = analyze(program).evaluate(batch=B)
    with pytest.raises(ProfileError, match=r"has shape \[65, 32\], but the program was exported "
                                           r"for \[\w+ in \[2, 64\], 32\]"):
        profile(report, (torch.randn(65, IN),), program=program, repeat=1, peak_flop_per_s=False)


def test_a_report_evaluated_at_one_size_is_not_timed_at_another():
    """Its FLOPs are those of 8 rows: divided by the latency of 16 they would halve the MFU."""
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(net(), (torch.randn(B, IN),), dynamic_shapes=({0: batch},))
    report = analyze(program).evaluate(batch=8)
    with pytest.raises(ProfileError, match=r"The report of ExportedProgram counts inputs of "
                                           r"shapes \[\[8, 32\]\], but the inputs given have "
                                           r"\[\[16, 32\]\]: evaluate the report"):
        profile(report, (torch.randn(16, IN),), program=program, repeat=1, peak_flop_per_s=False)


def test_a_constant_input_of_another_value_is_refused():
    class Times(nn.Module):
        def forward(self, x, n: int):
            return x * n

    program = torch.export.export(Times(), (torch.ones(2), 3))
    with pytest.raises(ProfileError, match=r"input args\[1\] of ExportedProgram is 4, but the "
                                           r"program was exported with the constant 3"):
        profile(program, (torch.ones(2), 4), repeat=1, peak_flop_per_s=False)


# --- nothing silently ignored ------------------------------------------------------------------

def test_program_is_refused_for_a_target_that_is_not_a_report(program_of_net):
    with pytest.raises(TypeError, match=r"program=\) names the program of a Report; the Net given "
                                        r"is timed itself"):
        profile(net(), (torch.randn(B, IN),), program=program_of_net)


def test_kwargs_without_args_are_refused_for_a_program(program_of_net):
    with pytest.raises(TypeError, match="kwargs without args"):
        profile(program_of_net, kwargs={"x": torch.randn(B, IN)})


@pytest.mark.parametrize(("args", "kwargs"), [({"x": 1}, None), ((), [1])], ids=["args", "kwargs"])
def test_args_and_kwargs_of_the_wrong_type_are_refused(program_of_net, args, kwargs):
    with pytest.raises(TypeError, match="profile.. takes (args as a tuple|kwargs as a dict)"):
        profile(program_of_net, args, kwargs)


@pytest.mark.parametrize("options", [dict(repeat=0), dict(warmup=-1), dict(peak_flop_per_s=0)],
                         ids=["repeat", "warmup", "peak"])
def test_the_profiler_checks_its_arguments_when_made_not_in_the_step(options):
    with pytest.raises(ValueError, match="FlopsProfiler.. needs|peak_flop_per_s is a dense"):
        FlopsProfiler(Scaled(), **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_the_profiler_refuses_cuda_without_cuda_when_made():
    with pytest.raises(ProfileError, match="asks for CUDA"):
        FlopsProfiler(Scaled(), device="cuda")
