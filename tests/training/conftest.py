"""Fixtures of the training tests."""

from __future__ import annotations

import pytest
import torch

from exportflops.roofline import devices


@pytest.fixture
def known_cpu(monkeypatch) -> float:
    """A CPU whose estimated peak is worked out by hand (`devices.cpu_peak`): 4 threads x 2 GHz
    x AVX2's 8 float32 lanes x 2 FMA units x 2 FLOPs per FMA = 256e9 FLOP/s, with no CUDA."""
    monkeypatch.setattr(devices, "cpu_clock_ghz", lambda: (2.0, "test clock"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return 4 * 2e9 * (8 * 2 * 2)
