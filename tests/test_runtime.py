"""The runtime pass (issue 7): every counted node timed, module latencies that add up along the
tree, the plain forward beside the timed replay, MFU, the training-loop profiler, and the errors.

Timing tests assert properties (orderings, sums, what was run how often), never speeds: the CI
machine is shared. Counts are derived by hand in the tests."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from exportflops import FlopsProfiler, ProfileError, Report, analyze, profile
from exportflops import devices, runtime

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
    return profile(net(), (torch.randn(B, IN),), warmup=2, repeat=9, peak_flops=False)


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
    assert runtime.overhead_s == pytest.approx(
        runtime.hooked_total.median_s - runtime.plain_total.median_s)
    assert runtime.residual_s == pytest.approx(
        runtime.plain_total.median_s - sum(t.latency.median_s for t in runtime.nodes))
    assert "plain forward: the model's own forward" in runtime.timer


def test_the_cpu_clock_is_monotonic(profiled):
    assert time.get_clock_info("perf_counter").monotonic
    assert profiled.runtime.timer.startswith("time.perf_counter_ns around each node (monotonic")


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
    report = profile(Sleeper(), (torch.ones(2),), warmup=1, repeat=5, peak_flops=False)
    assert SLEEP_MS["calls"] == 2 * 6
    (sleep,) = [t.latency for t in report.runtime.nodes
                if t.name in {n.name for n in report.nodes if "scheduled_sleep" in n.op}]
    assert 5e-3 <= sleep.min_s < 30e-3
    assert 30e-3 <= sleep.median_s < 45e-3
    assert 60e-3 <= sleep.max_s < 150e-3
    assert 30e-3 <= report.runtime.plain_total.median_s < 45e-3


# --- achieved FLOPS and MFU --------------------------------------------------------------------

def test_mfu_against_a_user_peak():
    report = profile(net(), (torch.randn(B, IN),), warmup=1, repeat=3, peak_flops=1e12)
    runtime = report.runtime
    assert runtime.peak_flop_per_s == 1e12 and runtime.peak_source == "user"
    assert runtime.achieved_flop_per_s == pytest.approx(
        report.total.flops / runtime.plain_total.median_s)
    assert runtime.mfu == pytest.approx(runtime.achieved_flop_per_s / 1e12)


def test_the_cpu_estimate_is_the_peak_when_the_user_gives_none(monkeypatch):
    """threads x 2.5 GHz x 32 FLOP/cycle: AVX2 has 8 float32 lanes, x 2 FMA units x 2 FLOPs."""
    monkeypatch.setattr(devices, "cpu_clock_ghz", lambda: (2.5, "test clock"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    report = profile(net(), (torch.randn(B, IN),), warmup=1, repeat=3)
    assert report.runtime.peak_flop_per_s == torch.get_num_threads() * 2.5e9 * 8 * 2 * 2
    assert report.runtime.peak_source.startswith("estimate, not a datasheet figure")
    assert report.runtime.mfu == pytest.approx(
        report.runtime.achieved_flop_per_s / report.runtime.peak_flop_per_s)


def test_peak_flops_false_measures_without_mfu(profiled):
    assert profiled.runtime.mfu is None and profiled.runtime.peak_flop_per_s is None


@pytest.mark.parametrize("peak", [0, -1e12, True], ids=["zero", "negative", "bool"])
def test_peak_flops_must_be_a_positive_rate(peak):
    with pytest.raises(ValueError, match="peak_flops is a dense peak in FLOP/s"):
        profile(net(), (torch.randn(B, IN),), repeat=1, peak_flops=peak)


@pytest.mark.parametrize(("warmup", "repeat"), [(-1, 5), (0, 0)], ids=["warmup", "repeat"])
def test_warmup_and_repeat_are_checked(warmup, repeat):
    with pytest.raises(ValueError, match="warmup >= 0 and repeat >= 1"):
        profile(net(), (torch.randn(B, IN),), warmup=warmup, repeat=repeat)


# --- the report --------------------------------------------------------------------------------

def test_a_report_with_runtime_round_trips_through_json(profiled):
    assert Report.model_validate_json(profiled.model_dump_json()) == profiled


def test_the_counts_are_analyze_s(profiled):
    assert profiled.model_copy(update={"runtime": None}) == analyze(net(), (torch.randn(B, IN),))


def test_a_report_is_timed_on_its_program_without_re_export(monkeypatch):
    model, x = net(), torch.randn(B, IN)
    program = torch.export.export(model, (x,))
    report = analyze(program)

    def no_export(*args, **kwargs):
        raise AssertionError("profile(report) exported again")

    monkeypatch.setattr(torch.export, "export", no_export)
    timed = profile(report, (x,), program=program, warmup=1, repeat=2, peak_flops=False)
    assert timed.model_copy(update={"runtime": None}) == report
    assert [t.name for t in timed.runtime.nodes] == [n.name for n in report.nodes]
    assert "plain forward: program.module()" in timed.runtime.timer


def test_a_saved_program_is_timed_on_its_example_inputs(tmp_path):
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net(), (torch.randn(B, IN),)), path)
    report = profile(path, warmup=1, repeat=2, peak_flops=False)
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
    profile(model, (x,), warmup=1, repeat=2, peak_flops=False)
    assert all(torch.equal(buffers[k], v) for k, v in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(x, x_before)


class DoublesInPlace(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_an_input_written_in_place_is_fresh_for_every_run():
    x = torch.ones(3)
    profile(DoublesInPlace(), (x,), warmup=1, repeat=3, peak_flops=False)
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
    monkeypatch.setattr(runtime, "_device_label", lambda device: f"{device} (stand-in)")
    model, x = net(), torch.randn(B, IN)
    program = torch.export.export(model, (x,))
    call = runtime._Call(analyze(program), program, model, (x,), {})
    measured = runtime._measure(program.module(), model, call, torch.device("cuda", 0),
                                warmup=2, repeat=3)
    assert StandInEvent.synchronizes == 2 + 3 + 1
    assert measured.timer.startswith("a pair of torch.cuda.Event per node")
    assert [len(samples) for samples in measured.node_samples] == [3] * len(call.report.nodes)
    assert all(s >= 0 for samples in measured.node_samples for s in samples)


@needs_cuda
def test_cuda_events_time_every_node():
    model, x = net().cuda(), torch.randn(B, IN, device="cuda")
    report = profile(model, (x,), device="cuda", warmup=2, repeat=5, peak_flops=False)
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
    profile(model, (x,), device="cuda", warmup=3, repeat=4, peak_flops=False)
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
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flops=False)
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
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flops=False)
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
    profiler = FlopsProfiler(model, warmup=1, repeat=2, peak_flops=False).start()
    model(torch.ones(2, IN), scale=torch.ones(2, 1))
    out = tmp_path / "profile.txt"
    text = profiler.print_model_profile(output_file=out)
    profiler.end()
    assert out.read_text() == text and "fc1" in text


def test_achieved_flops_and_mfu_per_node_and_module():
    """Each node's and module's rate is its FLOPs over its own median latency, its MFU that rate
    over the peak given."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    report = profile(model, (torch.randn(8, 32),), warmup=1, repeat=3, peak_flops=1e12)
    flops = {n.name: n.cost.flops for n in report.nodes}
    for node in report.runtime.nodes:
        assert node.achieved_flop_per_s == pytest.approx(flops[node.name] / node.latency.median_s)
        assert node.mfu == pytest.approx(node.achieved_flop_per_s / 1e12)
    for module in report.runtime.modules:
        assert module.achieved_flop_per_s == pytest.approx(
            report.module(module.path).inclusive.flops / module.inclusive_s)
