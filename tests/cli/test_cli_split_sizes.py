"""--pp and --cp refused before an hf: model is built where its config shows they cannot split it
(issue 48: these errors came after building and counting the model, 12 to 29 s): the builder
stands in for one that records each call and fails, so a refusal that reached it shows."""

from __future__ import annotations

import pytest

from exportflops.cli import main
from exportflops.errors import BuildError

pytest.importorskip("transformers")


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The model types the command built (`hf.models.build`, which fails here)."""
    import exportflops.hf.models as hf_models

    built: list[str] = []

    def build(config, device, transformers, *, whole=False):
        built.append(config.model_type)
        raise BuildError("the test's builder builds nothing")

    monkeypatch.setattr(hf_models, "build", build)
    return built


# Each refusal's words, from the config alone: llama's default config at --layers 2 holds 2
# decoder layers; its example is 128 tokens (HF_DEFAULT_SEQ_LEN, under its 2,048 positions).
REFUSED = {
    "more stages than layers": (
        ["--layers", "2", "--pp", "3"],
        "--pp 3 --schedule 1f1b: hf:llama has 2 layers (--layers 2), and a stage holds whole "
        "layers: 3 stages need 3 layers or more; pass --pp 2 or less, or --layers 3."),
    # interleaved1f1b runs 2 stages per rank: 2 ranks hold 4 stages.
    "a looped schedule's stages": (
        ["--layers", "2", "--pp", "2", "--schedule", "interleaved1f1b"],
        "4 stages (2 on each of --pp 2 ranks) need 4 layers or more; pass --pp 1 or less, or "
        "--layers 4, or a schedule with one stage per rank."),
    # torch's interleaved schedules take a multiple of the ranks (its rounds) past them.
    "microbatches the schedule refuses": (
        ["--layers", "4", "--pp", "2", "--schedule", "interleaved1f1b", "--microbatches", "5"],
        "torch's ScheduleInterleaved1F1B refuses it: Interleaved 1F1B requires the number of "
        "microbatches to be a multiple of the number of rounds (2), but got 5."),
    "a schedule of no name": (
        ["--layers", "2", "--pp", "2", "--schedule", "zigzag"],
        "--schedule zigzag: the schedules are gpipe, 1f1b,"),
    # load balanced: 2 x cp = 6 chunks, and 128 = 6 x 21 + 2.
    "a length cp cannot split": (
        ["--layers", "2", "--cp", "3"],
        "--cp 3: hf:llama's example has 128 tokens, which do not split into 6 equal chunks"),
    # 100 = 4 x 25 but not 8 x 12.5: 2 x cp = 8 chunks.
    "a --seq cp cannot split": (
        ["--layers", "2", "--seq", "100", "--cp", "4"],
        "pass --seq N with N a multiple of 8."),
}


@pytest.mark.parametrize("flags", list(REFUSED.values()), ids=list(REFUSED))
def test_split_flags_the_config_refuses_exit_2_before_the_model_is_built(flags, builds, capsys):
    argv, words = flags
    assert main(["hf:llama", *argv]) == 2
    assert words in capsys.readouterr().err
    assert builds == []


# What the config cannot rule out is left to the checks after the build: T5 has an encoder
# and a decoder stack, BERT's pipeline split counts its embeddings as a layer beside its 3
# encoder layers, so --pp 4 may split either; 128 tokens split into 2 x cp = 4 chunks.
REACHES_THE_BUILD = {
    "t5's two stacks": ["hf:t5", "--layers", "3", "--pp", "4"],
    "bert's embeddings": ["hf:bert", "--layers", "3", "--pp", "4"],
    "a length cp splits": ["hf:llama", "--layers", "2", "--cp", "2"],
    "stages as many as layers": ["hf:llama", "--layers", "2", "--pp", "2"],
}


@pytest.mark.parametrize("argv", list(REACHES_THE_BUILD.values()), ids=list(REACHES_THE_BUILD))
def test_split_flags_the_config_allows_reach_the_build(argv, builds, capsys):
    assert main(argv) == 1
    assert "the test's builder builds nothing" in capsys.readouterr().err
    assert builds == [argv[0].removeprefix("hf:")]
