"""A real two-stage pipeline under torchrun (gloo on CPU, tests/pipeline_worker.py) agrees with
the single-process analysis: what torch's second stage receives is what the record says stage 0
sends, and the matmul FLOPs torch's FlopCounterMode counts in a real GPipe step are the stage's
counted contractions times the microbatches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exportflops.parallel.pipeline import analyze_pipeline
from exportflops.records.pipeline import PipelineReport
from tests.pipeline_worker import CONFIG, MICROBATCH, MICROBATCHES, SEQ, model_and_microbatch

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch built without torch.distributed")
F32 = 4  # bytes per float32 element
# torch's FlopCounterMode counts contractions only, and no attention on CPU (it has no formula
# for _scaled_dot_product_flash_attention_for_cpu): compare the linears and matmuls.
MATMULS = ("aten.linear.default", "aten.mm.default", "aten.addmm.default", "aten.bmm.default")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_real_gloo_stages_agree_with_the_single_process_analysis(tmp_path):
    root = Path(__file__).parents[2]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               str(root / "tests" / "pipeline_worker.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

    model, tokens = model_and_microbatch()  # on cpu as the workers build it
    alone = analyze_pipeline(model, (tokens,), stages=["layers.2"], schedule="gpipe",
                             microbatches=MICROBATCHES, mode="train", device=None).record
    for rank in range(2):
        written = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert PipelineReport.model_validate_json(written["record"]) == alone
        stage = alone.stages[rank]
        received = [[spec.shape, spec.dtype] for spec in stage.inputs] if rank else []
        assert written["received"] == received
        macs = sum(written["macs_by_op"].get(op, 0) for op in MATMULS)
        assert written["matmul_flops"] == MICROBATCHES * 2 * macs  # 2 FLOPs per MAC
    # Stage 1 receives the hidden state (B, T, dim) and the rotary tables (T, head_dim) twice.
    assert written["received"] == [[[MICROBATCH, SEQ, CONFIG.dim], "float32"],
                                   [[SEQ, CONFIG.head_dim], "float32"],
                                   [[SEQ, CONFIG.head_dim], "float32"]]
    assert [c.bytes for c in alone.stages[0].sends] == [
        MICROBATCH * SEQ * CONFIG.dim * F32, SEQ * CONFIG.head_dim * F32,
        SEQ * CONFIG.head_dim * F32]
