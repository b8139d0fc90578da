"""``exportflops.hf`` as a library: `build` and `analyze` from Python with no import of the
command, errors that name the functions' arguments (the command names its flags), and the
registry of example-input rules.

Sizes from transformers' default LlamaConfig: hidden_size 4096, intermediate_size 11008,
vocab_size 32000, 32 heads of 128 (as many key-value heads).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
import torch

import exportflops
from exportflops import hf
from exportflops.errors import BuildError, ExportError, UsageError
from exportflops.hf import rules
from tests.cli_support import ROOT, one_paragraph, run

tf = pytest.importorskip("transformers")

BUILD_ALONE = """
import json, sys
from exportflops import hf

built = hf.build("llama", device="meta", layers=2, batch=3, seq=16)
print(json.dumps({"layers": len(built.model.model.layers),
                  "config_layers": built.model.config.num_hidden_layers,
                  "args": [list(a.shape) for a in built.args],
                  "device": built.args[0].device.type,
                  "command": "exportflops.cli" in sys.modules}))
"""


def test_build_runs_from_python_without_the_command():
    done = subprocess.run([sys.executable, "-c", BUILD_ALONE], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert built == {"layers": 2, "config_layers": 2, "args": [[3, 16]], "device": "meta",
                     "command": False}


def test_build_takes_the_prefix_and_a_torch_device():
    model, args, kwargs = hf.build("hf:llama", device=torch.device("meta"), layers=1, seq=8)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert [tuple(a.shape) for a in args] == [(1, 8)] and kwargs == {}


def test_analyze_counts_what_analyze_counts_of_the_built_model():
    report = hf.analyze("llama", layers=1, batch=1, seq=8)
    assert report.total == exportflops.analyze(*hf.build("llama", layers=1, seq=8)).total
    # By hand, for T = 8 tokens through one layer of width d = 4096: q, k, v and o projections
    # T x 4 x d^2; the MLP's gate, up and down T x 3 x d x 11008; attention (QK and AV over T
    # keys) 2 x T x T x d; the head T x d x 32000.
    t, d = 8, 4096
    assert report.total.macs == t * 4 * d * d + t * 3 * d * 11008 + 2 * t * t * d + t * d * 32000


def _tiny_qwen2_vl_vision(folder) -> str:
    tf.Qwen2VLVisionConfig(depth=1, embed_dim=32, hidden_size=48, num_heads=2, mlp_ratio=2,
                           patch_size=14, temporal_patch_size=2, in_channels=3,
                           spatial_merge_size=2).save_pretrained(folder)
    return str(folder / "config.json")


def test_analyze_builds_again_on_cpu_what_meta_cannot_decide(tmp_path):
    # Qwen2-VL's vision tower splits its patches by the image grid's values: on meta (the
    # default) export stops there, and analyze builds it again on cpu, as the command does.
    spec = _tiny_qwen2_vl_vision(tmp_path)
    report = hf.analyze(spec)
    assert report.value_guards and not report.uncounted
    with pytest.raises(ExportError):  # a device given is kept
        hf.analyze(spec, device="meta")


def test_an_error_names_the_argument_not_the_flag():
    # LlamaConfig's max_position_embeddings: 2048.
    with pytest.raises(UsageError, match=r"seq=1000000: .* pass seq=2048 or less") as error:
        hf.build("llama", layers=1, seq=10**6)
    assert "--seq" not in str(error.value)
    with pytest.raises(UsageError, match=r"^layers=0: "):
        hf.build("llama", layers=0)
    with pytest.raises(UsageError, match=r"^batch=0: "):
        hf.build("llama", batch=0)


class ReadsAnInputWhileNone(torch.nn.Module):
    def forward(self, x, states=None):
        return x + states.sum()


def test_an_input_forward_read_while_none_is_named_with_the_argument_to_pass_it():
    built = hf.Built(ReadsAnInputWhileNone(), (torch.ones(2),), {})
    with pytest.raises(UsageError, match=r"needs 'states' .* pass it with kwargs=\."):
        hf.analyze_built(built)


@pytest.mark.parametrize(("library", "command"), [
    ("seq=128: takes 5184 tokens; pass seq=5184 or more.",
     "--seq 128: takes 5184 tokens; pass --seq 5184 or more."),
    ("pass batch= from 1 to 199.", "pass --batch from 1 to 199."),
    ('build it on cpu (device="cpu", with layers=N to keep it small).',
     "build it on cpu (--device cpu, with --layers N to keep it small)."),
    ("pass the model's inputs with args= and kwargs=.",
     "pass the model's inputs with --input and --kwargs."),
    ("or smaller inputs (seq=, batch=, kwargs=).", "or smaller inputs (--seq, --batch, --kwargs)."),
    # Field names that end like an argument are not arguments.
    ("num_hidden_layers=2 and max_seq=4", "num_hidden_layers=2 and max_seq=4"),
], ids=["value", "bare", "quoted", "inputs", "list", "fields"])
def test_the_command_names_its_flags_for_the_librarys_arguments(library, command):
    from exportflops.cli.targets import flags

    assert flags(library) == command


def test_the_command_names_the_flag_in_the_librarys_error():
    result = run("hf:llama", "--layers", "1", "--seq", "1000000", "--view", "summary")
    assert result.returncode == 2 and one_paragraph(result.stderr)
    assert "--seq 1000000: LlamaConfig has 2048 positions" in result.stderr
    assert "pass --seq 2048 or less" in result.stderr and "seq=" not in result.stderr


def test_the_command_analyzes_an_hf_model_through_the_library():
    result = run("hf:llama", "--layers", "1", "--seq", "8", "--view", "summary")
    assert result.returncode == 0, result.stderr


def test_a_names_rules_are_asked_family_first_in_the_order_they_were_registered():
    asked = [f"{rule.__module__.rpartition('.')[2]}.{rule.__name__}"
             for tier in rules.TIERS for rule in rules.RULES[tier]["hidden_states"]]
    # Qwen2.5-Omni's speech DiT, a codec's decoder (VibeVoice's), a windowed ViT, then any
    # model's embeddings: the order the families were asked in one function before.
    assert asked == ["audio.speech_dit", "audio.codec_latents", "images.windowed_patch_states",
                     "modalities.embeddings"]


def test_a_rule_registered_twice_for_a_name_is_refused(monkeypatch):
    monkeypatch.setattr(rules, "RULES", {tier: {} for tier in rules.TIERS})

    def ones(wanted):
        return wanted.zeros((wanted.batch,)) + 1

    rules.input_rule("counts")(ones)
    with pytest.raises(rules.DuplicateRuleError, match="'counts' already has the rule"):
        rules.input_rule("counts")(ones)
    made = rules.make(rules.Wanted("counts", None, "cpu", 2, None))
    assert made.tolist() == [1.0, 1.0]
    assert rules.make(rules.Wanted("other", None, "cpu", 2, None)) is None


@pytest.mark.skipif(importlib.util.find_spec("natten") is not None,
                    reason="natten is installed: DiNAT builds")
def test_a_type_that_needs_a_package_transformers_lacks_names_the_package_on_its_first_line():
    with pytest.raises(BuildError) as caught:
        hf.build("dinat", layers=1)
    first = str(caught.value).splitlines()[0]
    assert "ImportError: DinatModel requires the natten library" in first


@pytest.mark.parametrize(("layout", "options", "words"), [
    # llama's config capped at layers=2 holds 2 decoder layers: 3 stages need 3.
    (dict(pp=3), dict(layers=2), "pp=3 schedule='1f1b': llama has 2 layers (layers=2), and a "
                                 "stage holds whole layers: 3 stages need 3 layers or more"),
    # seq=100, load balanced over cp=4: 2 x 4 = 8 chunks, and 100 = 8 x 12 + 4.
    (dict(cp=4), dict(layers=2, seq=100), "cp=4: llama's example has 100 tokens, which do not "
                                          "split into 8 equal chunks"),
], ids=["stages-past-layers", "tokens-past-chunks"])
def test_check_layout_refuses_a_layout_the_config_cannot_split(layout, options, words):
    from exportflops.errors import InputError
    from exportflops.parallel import Layout

    with pytest.raises(InputError, match=re.escape(words)):
        hf.check_layout("llama", Layout(**layout), **options)


def test_check_layout_leaves_the_callers_own_inputs_and_what_splits_to_the_analysis():
    from exportflops.parallel import Layout

    # 2 x 4 = 8 chunks do not divide seq=100, but inputs of the caller's own replace the
    # example; 2 stages hold 2 layers.
    hf.check_layout("llama", Layout(cp=4), layers=2, seq=100, example=False)
    hf.check_layout("hf:llama", Layout(pp=2), layers=2)
