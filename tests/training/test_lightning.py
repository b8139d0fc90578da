"""Lightning: `ExactThroughputMonitor` logs each batch's exact FLOPs and an MFU over the peak
given, in a 3-step CPU run with batches of different sizes (a fixed ``flops_per_batch``, as
Lightning's own monitor takes it, would be wrong for two of them)."""

from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.loggers import Logger  # noqa: E402

from exportflops.training import flops_per_batch  # noqa: E402
from exportflops.training.lightning import ExactThroughputMonitor  # noqa: E402

IN, OUT = 8, 4
ROWS = (2, 5, 3)  # one batch per step, each of its own size
PEAK = 1e9  # FLOP/s, given: the CPU has no datasheet row


class MetricsKept(Logger):
    """Keeps what the Trainer logs, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict[str, float]] = []

    name, version = "kept", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append(dict(metrics))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(IN, OUT, bias=False)

    def training_step(self, batch, index):
        (x,) = batch
        return self.fc(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train_flops(rows: int) -> int:
    """A bias-free Linear's training step on ``rows`` rows of plain data:
    1. forward: rows x IN x OUT multiply-accumulates, 2 FLOPs each;
    2. weight gradient: the same matmul again (x^T @ grad_out);
    3. no input gradient: x needs none."""
    return 2 * (2 * rows * IN * OUT)


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    module = Regression()
    fpb = flops_per_batch(module.fc, (torch.randn(3, IN),))
    batches = [(torch.randn(rows, IN),) for rows in ROWS]
    kept = MetricsKept()
    monitor = ExactThroughputMonitor(lambda batch: fpb(batch[0]),
                                     batch_size_fn=lambda batch: batch[0].shape[0],
                                     window_size=2, peak_flop_per_s=PEAK)
    trainer = pl.Trainer(max_steps=len(ROWS), accelerator="cpu", logger=kept,
                         callbacks=[monitor], log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
    return kept.logged, module, monitor


def test_each_logged_rate_is_its_own_batch_exact_flops_over_its_time(trained):
    """Window 2: the rate logged at step k is batch k's FLOPs over the time since step k-1
    (Lightning's ``train/time`` is cumulative)."""
    logged, _, _ = trained
    steps = [m for m in logged if "train/time" in m]
    assert [m["train/batches"] for m in steps] == [1, 2, 3]
    for before, now, rows in zip(steps, steps[1:], ROWS[1:]):
        seconds = now["train/time"] - before["train/time"]
        assert now["train/device/flops_per_sec"] * seconds == pytest.approx(train_flops(rows),
                                                                           rel=1e-9)


def test_the_mfu_is_the_rate_over_the_peak_given(trained):
    logged, _, monitor = trained
    rated = [m for m in logged if "train/device/mfu" in m]
    assert len(rated) == len(ROWS) - 1  # the first step only opens the window of 2
    for metrics in rated:
        assert metrics["train/device/mfu"] == pytest.approx(
            metrics["train/device/flops_per_sec"] / PEAK, rel=1e-12)
    assert (monitor.peak.flop_per_s, monitor.peak.device) == (PEAK, "user")


def test_nothing_is_left_on_the_users_module(trained):
    _, module, _ = trained
    assert not hasattr(module, "flops_per_batch")


def test_on_cpu_without_a_peak_the_mfu_is_logged_as_estimated(known_cpu):
    """The rule profile() follows: the CPU's estimated peak (the fixture's, by hand), its MFU
    under its own key, never as train/device/mfu."""
    fpb = flops_per_batch(torch.nn.Linear(IN, OUT, bias=False), (torch.randn(3, IN),))
    kept = MetricsKept()
    monitor = ExactThroughputMonitor(lambda batch: fpb(batch[0]),
                                     batch_size_fn=lambda batch: batch[0].shape[0],
                                     window_size=2)
    trainer = pl.Trainer(max_steps=len(ROWS), accelerator="cpu", logger=kept,
                         callbacks=[monitor], log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    batches = torch.utils.data.DataLoader([(torch.randn(rows, IN),) for rows in ROWS],
                                          batch_size=None)
    trainer.fit(Regression(), batches)
    assert (monitor.peak.flop_per_s, monitor.peak.estimated) == (known_cpu, True)
    rated = [m for m in kept.logged if "train/device/mfu_estimated" in m]
    assert len(rated) == len(ROWS) - 1 and not any("train/device/mfu" in m for m in kept.logged)
    for metrics in rated:
        assert metrics["train/device/mfu_estimated"] == pytest.approx(
            metrics["train/device/flops_per_sec"] / known_cpu, rel=1e-12)


def test_a_precision_that_names_no_dtype_asks_for_one():
    from exportflops.training.lightning import _precision_dtype

    assert _precision_dtype("bf16-mixed") is torch.bfloat16
    assert _precision_dtype("16-mixed") is torch.float16
    with pytest.raises(ValueError, match=r"dtype="):
        _precision_dtype("transformer-engine")
