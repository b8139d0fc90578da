"""``--memory``: one step's memory through `exportflops.cli.main`, derived by hand for the
factory ``cli_models:mlp``: Linear(4, 8), ReLU, Linear(8, 2) on a (3, 4) float32 input."""

from __future__ import annotations

import json

import pytest

from exportflops.cli import main
from tests.footprint.models import MIXTRAL_PARAMS, llama_rank_params

FP32 = 4
PARAMS = (4 * 8 + 8 + 8 * 2 + 2) * FP32  # 232 B
# A forward's peak at the ReLU: the parameters, the input (3x4), the first Linear's output (3x8)
# it reads and its own (3x8), as tests/footprint/test_memory.py derives it.
FORWARD_PEAK = PARAMS + (3 * 4 + 3 * 8 + 3 * 8) * FP32  # 472 B


def _memory(models, capsys, *flags: str) -> tuple[int, str, str]:
    code = main([f"{models / 'cli_models.py'}:mlp", "--memory", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_names_the_peak_the_kinds_and_each_module(models, capsys):
    code, out, err = _memory(models, capsys)
    assert code == 0, err
    assert out.splitlines()[0] == ("Memory of Sequential: forward under no_grad; peak 472 B in "
                                   "the forward at aten.relu.default #2 in 1; storage bytes")
    assert "\nparameters " in out and "\n  0 " in out and "\n  2 " in out


def test_json_is_the_memory_report_with_the_hand_peak(models, capsys):
    code, out, err = _memory(models, capsys, "--format", "json")
    assert code == 0, err
    record = json.loads(out)
    assert (record["peak_bytes"], record["by_kind"]["parameters"]) == (FORWARD_PEAK, PARAMS)


@pytest.mark.parametrize("optimizer, states", [
    ("adamw", 2 * PARAMS + 4 * FP32),  # two moments per parameter, a 0-dim `step` per tensor
    ("sgd", 0),                        # no momentum: no buffer
], ids=["adamw", "sgd"])
def test_a_training_step_keeps_the_optimizers_states(models, capsys, optimizer, states):
    code, out, err = _memory(models, capsys, "--mode", "train", "--optimizer", optimizer,
                             "--format", "json")
    assert code == 0, err
    record = json.loads(out)
    assert (record["optimizer"], record["max_by_kind"]["optimizer"]) == (optimizer, states)
    assert record["max_by_kind"]["gradients"] == PARAMS


def test_a_device_model_says_whether_it_fits_and_by_how_much(models, capsys):
    code, out, err = _memory(models, capsys, "--device-model", "t4")
    assert code == 0, err
    assert out.rstrip().splitlines()[-1].startswith("Fits t4: peak 472 B of 16.00 GB")
    code, out, err = _memory(models, capsys, "--device-model", "t4", "--format", "json")
    fit = json.loads(out)["fit"]
    # the T4 datasheet's "16 GB GDDR6" as 10^9 bytes, less the hand peak
    assert (fit["fits"], fit["headroom_bytes"]) == (True, 16 * 10**9 - FORWARD_PEAK)


@pytest.mark.parametrize("flags, words", [
    (("--device-model", "v100-sxm2"), "the device table knows the memory of a100-sxm-40gb"),
    (("--device-model", "cpu"), "--memory --device-model 'cpu'"),
    (("--format", "csv"), "--memory prints one step's memory"),
    (("--profile", "--device", "cpu"), "not with --view, and not with --profile"),
], ids=["a-row-of-two-boards", "cpu", "csv", "profile"])
def test_what_memory_cannot_combine_with_is_a_usage_error(models, capsys, flags, words):
    code, _, err = _memory(models, capsys, *flags)
    assert code == 2 and words in err


def test_an_optimizer_without_a_training_step_is_refused(models, capsys):
    code, _, err = _memory(models, capsys, "--optimizer", "sgd")
    assert code == 2 and "--optimizer picks the optimizer of --memory --mode train" in err


def test_fsdp_gives_the_step_of_the_rank_asked_with_its_shards(capsys):
    # tests.parallel_models:two_blocks, two NormMLP blocks of 2H + 2HF = 2080 float32
    # parameters each (H 16, F 64), FSDP2 over 2 ranks: rank 1 holds half of both blocks,
    # and one block's unsharded parameters at a time on top.
    code = main(["tests.parallel_models:two_blocks", "--memory", "--fsdp", "2", "--rank", "1",
                 "--mode", "train", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    block = (2 * 16 + 2 * 16 * 64) * FP32
    assert (record["world_size"], record["rank"]) == (2, 1)
    assert record["max_by_kind"]["parameters"] == 2 * block // 2 + block


def test_pp_gives_the_step_of_the_stage_asked_with_its_microbatches_in_flight(capsys):
    # tests.parallel_models:two_blocks split into 2 stages of one NormMLP block (2H + 2HF =
    # 2080 float32 parameters, H 16, F 64); its input (2 x 8 tokens) one microbatch. GPipe
    # keeps all 4 microbatches in flight, each saving LayerNorm's mean and rstd (1 per token),
    # up's normed input (T x H) and relu's output (T x F).
    code = main(["tests.parallel_models:two_blocks", "--memory", "--pp", "2", "--schedule",
                 "gpipe", "--microbatches", "4", "--rank", "1", "--mode", "train",
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    tokens = 2 * 8
    assert (record["world_size"], record["rank"]) == (2, 1)
    assert record["max_by_kind"]["parameters"] == (2 * 16 + 2 * 16 * 64) * FP32
    assert record["max_by_kind"]["activations"] == 4 * (2 + 16 + 64) * tokens * FP32


def _rank_record(capsys, factory: str, *flags: str, world: int = 2, rank: int = 1) -> dict:
    """The JSON record of rank ``rank`` of MODEL ``factory`` split by ``flags`` over ``world``
    ranks."""
    code = main([f"tests.footprint.models:{factory}", "--memory", *flags, "--rank", str(rank),
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    assert (record["world_size"], record["rank"]) == (world, rank)
    return record


def test_ep_gives_the_step_of_the_rank_asked_with_its_experts_only(capsys):
    # tests/footprint/models.py's Mixtral: 2 MoE layers of 4 experts (gate_up_proj 4 x 256 x 64,
    # down_proj 4 x 64 x 128); over ep 2 a rank holds 2 of each layer's experts and every other
    # parameter.
    record = _rank_record(capsys, "mixtral_ids", "--ep", "2")
    dropped = 2 * 2 * 3 * 128 * 64  # layers x experts not held x (2I + I) x H
    assert record["max_by_kind"]["parameters"] == (MIXTRAL_PARAMS - dropped) * FP32


def test_ep_over_tp_gives_the_step_of_the_rank_asked_with_its_experts_and_tp_shards(capsys):
    # The same Mixtral over ep 2 laid on tp 2: its experts as above, and transformers' plan
    # halves attention (q, k + v, o: 64 x 64 + 2 x 32 x 64 + 64 x 64 a layer) and the embedding
    # and head (256 x 64 each) on their vocabulary.
    record = _rank_record(capsys, "mixtral_ids", "--ep", "2", "--tp", "2", "--mode", "train")
    dropped = 2 * 2 * 3 * 128 * 64 + 2 * 12288 // 2 + 2 * 256 * 64 // 2
    assert record["max_by_kind"]["parameters"] == (MIXTRAL_PARAMS - dropped) * FP32


def test_cp_gives_the_step_of_the_rank_asked_on_its_sequence_shard(capsys):
    # tests/footprint/models.py's Llama on (2, 32) token ids: a ring of 2 runs 16 positions of
    # each row, int64 ids.
    record = _rank_record(capsys, "llama_ids", "--cp", "2")
    assert record["max_by_kind"]["inputs"] == 2 * 16 * 8


def test_cp_with_tp_gives_the_step_of_a_ring_rank_on_its_tensor_parallel_shards(capsys):
    # tests/footprint/models.py's Llama over a ring of 2 x tp 2: rank 3 holds its tp rank's
    # shards of every parameter (cp shards none) and 16 positions of each row of int64 ids.
    record = _rank_record(capsys, "llama_ids", "--cp", "2", "--tp", "2", world=4, rank=3)
    assert record["max_by_kind"]["parameters"] == llama_rank_params(2) * FP32
    assert record["max_by_kind"]["inputs"] == 2 * 16 * 8


def test_html_is_the_memory_page_with_its_timeline_and_the_fit(models, capsys, tmp_path):
    page = tmp_path / "memory.html"
    code, _, err = _memory(models, capsys, "--format", "html", "--device-model", "t4",
                           "--output", str(page))
    assert code == 0, err
    out = page.read_text()
    assert out.startswith("<!DOCTYPE html>") and "id=\"memory-timeline\"" in out
    assert "Fits t4: peak 472 B" in out


@pytest.mark.parametrize("flags, states", [
    # Adagrad's state_sum per parameter and a 0-dim float32 `step` per tensor.
    (("--optimizer", "adagrad"), PARAMS + 4 * FP32),
    # bf16-master: an fp32 master copy and AdamW's two fp32 moments per parameter, the steps.
    (("--precision", "bf16-master"), 3 * PARAMS + 4 * FP32),
], ids=["adagrad", "bf16-master"])
def test_the_optimizer_and_precision_flags_reach_the_step(models, capsys, flags, states):
    code, out, err = _memory(models, capsys, "--mode", "train", *flags, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["max_by_kind"]["optimizer"] == states


def test_a_precision_without_a_training_step_is_refused(models, capsys):
    code, _, err = _memory(models, capsys, "--precision", "bf16-master")
    assert code == 2 and "--precision sets the dtypes of --memory --mode train's step" in err
