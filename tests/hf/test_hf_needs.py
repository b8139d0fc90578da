"""Inputs that a forward's signature makes optional and its code needs (issue 12): read from the
None that transformers' code met, made from the config, and blamed on us when we do not make
them.

Sizes from transformers 5.23's default configs: Qwen2-VL's vision tower has patch_size 14,
temporal_patch_size 2, spatial_merge_size 2, in_channels 3 and no image_size (so 224, the
builder's default); GLM-4V's has image_size 336 and the same patches; Kosmos-2 has
latent_query_num 64; Qwen2-Audio's encoder reads whisper's layout, num_mel_bins 128 by
max_source_positions 1,500 x 2 frames.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model, missed_input
from exportflops.hf.media import grid, image_tokens, mask, patch_grid, patches
from exportflops.hf.needs import fake_error, innermost, needed_input
from tests.cli_support import named_inputs

tf = pytest.importorskip("transformers")
META = torch.device("meta")
CPU = torch.device("cpu")


# --- reading the None --------------------------------------------------------------------


def _blocks(x, size):
    return x.shape[1] // size  # reads .shape of a None x


def _local_mask(attention_mask, size):
    return _blocks(attention_mask, size)


def _embed(ids, img_mask=None, embeds=None):
    return img_mask.to(torch.bool)


def _raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as error:  # the error under test
        return error
    raise AssertionError("expected an error")


def test_a_none_read_two_calls_down_names_the_callers_input():
    # LongT5's shape: forward passes attention_mask=None to a helper that reads x.shape.
    error = _raised(lambda input_ids, attention_mask=None: _local_mask(attention_mask, 16),
                    torch.zeros(1, 4))
    assert needed_input(error, ["input_ids", "attention_mask"]) == "attention_mask"


def test_a_keyword_argument_names_the_input_among_several_nones():
    # Kosmos-2's shape: embeds=None and img_mask=None both passed; img_mask was read.
    def forward(input_ids, image_embeds_position_mask=None, inputs_embeds=None):
        return _embed(input_ids, embeds=inputs_embeds, img_mask=image_embeds_position_mask)

    error = _raised(forward, torch.zeros(1, 4))
    parameters = ["input_ids", "image_embeds_position_mask", "inputs_embeds"]
    assert needed_input(error, parameters) == "image_embeds_position_mask"


def test_a_name_read_inside_is_the_parameter_it_ends():
    # Qwen2-VL's shape: the tower reads grid_thw.device; the model's input is image_grid_thw.
    def tower(grid_thw):
        return grid_thw.device

    error = _raised(lambda pixel_values, image_grid_thw=None: tower(image_grid_thw), None)
    assert needed_input(error, ["pixel_values", "video_grid_thw", "image_grid_thw"]) in (
        "image_grid_thw", "video_grid_thw")


def test_a_none_iterated_over_names_the_input():
    # LLaVA-NeXT's shape: a comprehension over image_sizes, which forward got as None.
    def forward(pixel_values, image_sizes=None):
        return [size for size in image_sizes]

    error = _raised(forward, None)
    assert needed_input(error, ["pixel_values", "image_sizes"]) == "image_sizes"


def test_a_none_passed_to_an_op_through_a_module_names_the_input():
    # BLT's local decoder: a Linear's input is the patch_embeds forward got as None; the
    # module call between them passes it on as *args.
    projection = torch.nn.Linear(2, 2)

    def forward(input_ids, patch_embeds=None):
        return projection(patch_embeds)

    error = _raised(forward, torch.zeros(1, 2))
    assert needed_input(error, ["input_ids", "patch_embeds"]) == "patch_embeds"


def _passing_on(func):
    def wrapped(*args, **kwargs):  # a decorator's wrapper: transformers' deprecate_kwarg
        return func(*args, **kwargs)
    return wrapped


@_passing_on
def _cross_attention(hidden_states, cross_attention_states):
    return cross_attention_states.shape  # reads .shape of a None


def test_a_none_passed_on_through_a_decorators_wrapper_names_the_input():
    # Dia's decoder since transformers 5.24: the layer passes encoder_hidden_states (None)
    # positionally to an attention whose forward a deprecate_kwarg wrapper calls with *args.
    def forward(input_ids, encoder_hidden_states=None):
        return _cross_attention(input_ids, encoder_hidden_states)

    error = _raised(forward, torch.zeros(1, 2))
    assert needed_input(error, ["input_ids", "encoder_hidden_states"]) == "encoder_hidden_states"


class _Scaled:
    scale = None  # an attribute, not an input

    def inner(self, x, gate=None):
        return gate.shape  # reads .shape of a None

    def mid(self, x, shape, mask):
        return self.inner(x, self.scale).view(1, *shape)  # unpacks a shape, passes nothing on


def test_an_unpacked_shape_on_a_callers_line_passes_no_none_on():
    # The None is an attribute of the caller's; the outer forward's attention_mask, also None,
    # is not what was read.
    def forward(input_ids, attention_mask=None):
        return _Scaled().mid(input_ids, (2,), attention_mask)

    error = _raised(forward, torch.zeros(1, 2))
    assert needed_input(error, ["input_ids", "attention_mask"]) is None


def test_other_errors_name_no_input():
    assert needed_input(_raised(lambda: [][1]), ["input_ids"]) is None
    # A None of the forward's own making (not one of its parameters) names none either.
    assert needed_input(_raised(lambda x: (lambda y=None: y + x)(), 1), ["x"]) is None


def test_a_missing_input_of_a_module_is_blamed_on_the_builder():
    class Tower(torch.nn.Module):
        def forward(self, hidden_states, grid_thw=None):
            return hidden_states * grid_thw.shape[0]

    tower, states = Tower(), torch.zeros(2, 3)
    error = _raised(tower, states)
    assert missed_input(error, tower, (states,), {}) == "grid_thw"
    assert missed_input(error, tower, (states,), {"grid_thw": states}) is None


# --- Qwen2-VL's patches, grid and image tokens -------------------------------------------


@pytest.mark.parametrize(("model_type", "side"), [("qwen2_vl", 224 // 14), ("glm4v", 336 // 14)])
def test_the_patch_grid_and_image_tokens_follow_the_config(model_type, side):
    vision = tf.AutoConfig.for_model(model_type).vision_config
    assert patch_grid(vision) == (1, side, side)
    assert grid("image_grid_thw", vision, CPU, batch=2).tolist() == [[1, side, side]] * 2
    assert grid("image_grid_hw", vision, CPU, batch=1).tolist() == [[side, side]]
    # 3 channels x 2 frames x 14 x 14 pixels a patch; the merger joins 2 x 2 patches a token.
    assert tuple(patches(vision, CPU, batch=2).shape) == (2 * side * side, 3 * 2 * 14 * 14)
    assert image_tokens(vision) == side * side // 4


def test_qwen2_vl_gets_patches_a_grid_and_one_placeholder_per_image_token():
    model, args, kwargs = hf_model("qwen2_vl", META, None, layers=1)
    named = named_inputs(model, args, kwargs)
    assert tuple(named["pixel_values"].shape) == (16 * 16, 1176)
    assert tuple(named["image_grid_thw"].shape) == (1, 3)
    assert tuple(named["mm_token_type_ids"].shape) == tuple(named["input_ids"].shape)


def test_the_placeholders_are_the_configs_image_token_as_many_as_the_image_has():
    from exportflops.hf.inputs import _patch_inputs

    config = tf.AutoConfig.for_model("qwen2_vl")
    inputs = {"input_ids": torch.zeros((2, 128), dtype=torch.long), "pixel_values": None}
    _patch_inputs(inputs, "pixel_values", "image_grid_thw", {"mm_token_type_ids"}, config,
                  CPU, batch=2)
    # 16 x 16 patches / (2 x 2) = 64 placeholders per example, of image_token_id 151655.
    assert ((inputs["input_ids"] == 151655).sum(dim=1) == 64).all()
    assert (inputs["mm_token_type_ids"].sum(dim=1) == 64).all()


# --- masks ------------------------------------------------------------------------------


def test_a_token_mask_marks_as_many_image_tokens_as_the_config_counts():
    config = tf.AutoConfig.for_model("kosmos-2")
    made = mask("image_embeds_position_mask", torch.zeros((1, 128), dtype=torch.long), config,
                config, batch=1)
    assert made.sum().item() == 64 and made.shape == (1, 128)


@pytest.mark.parametrize(("model_type", "name", "shape"), [
    ("qwen2_audio", "feature_attention_mask", (1, 1500 * 2)),
    ("longt5", "attention_mask", (1, 128)),
    ("kosmos-2", "image_embeds_position_mask", (1, 128)),
])
def test_a_needed_mask_is_made_and_the_model_analyzes(model_type, name, shape):
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    assert tuple(named_inputs(model, args, kwargs)[name].shape) == shape
    report = analyze(model, args, kwargs)
    assert report.uncounted == [] and report.total.flops > 0


# --- blame ------------------------------------------------------------------------------


def test_an_input_check_in_transformers_forward_is_blamed_on_the_builder():
    # GPT-2's forward refuses input_ids and inputs_embeds together (a ValueError of its own):
    # the inputs were ours.
    from exportflops.hf.models import blame

    model, args, _ = hf_model("gpt2", META, None, layers=1)
    both = {"inputs_embeds": torch.zeros((1, 128, 768), device=META)}
    error = _raised(model, *args, **both)
    assert isinstance(error, ValueError)
    assert blame(error, model, args, both) == "ours"
    assert blame(error) == "theirs"  # without the model, its frame is all that is known


def test_a_check_of_the_config_itself_is_blamed_on_transformers():
    # Step 3.5's default config sets no sliding_window, which its masks read: transformers'
    # mask code raises a ValueError about the config, naming none of forward's inputs.
    from exportflops.hf.models import blame

    model, args, kwargs = hf_model("step3p5", META, None, layers=1)
    assert model.config.sliding_window is None
    error = innermost(fake_error(model, args, kwargs))
    assert isinstance(error, ValueError) and "config" in str(error)
    assert blame(error, model, args, kwargs) == "theirs"


def test_embeddings_replace_ids_that_forward_refuses():
    # Qwen3-Omni's code predictor raises "`input_ids` is expected to be `None`": it reads the
    # embeddings its talker sums, (batch, tokens, hidden_size 1024 in the default config).
    model, args, kwargs = hf_model("qwen3_omni_moe_talker_code_predictor", META, None, layers=1)
    named = named_inputs(model, args, kwargs)
    assert "input_ids" not in named and tuple(named["inputs_embeds"].shape) == (1, 128, 1024)
    assert analyze(model, args, kwargs).uncounted == []


def test_the_command_exits_2_naming_an_input_forward_needed_and_hf_did_not_make(
        capfd, monkeypatch):
    # DeepSeek-OCR2's vision encoder reads num_patches, the image's patches before its queries
    # in the sequence, which hf: now reads off the SAM tower of the composite holding it: with
    # that rule gone, it is an input hf: cannot make.
    from exportflops.hf import images as hf_image_inputs
    from exportflops.cli import main

    monkeypatch.setattr(hf_image_inputs, "patches_then_queries", lambda *a, **k: None)
    assert main(["hf:deepseek_ocr2_encoder", "--layers", "1", "--view", "summary"]) == 2
    error = capfd.readouterr().err
    assert "'num_patches'" in error and "--kwargs" in error


def test_a_deeper_model_gets_the_inputs_its_one_layer_twin_was_probed_for():
    # At 2 layers hf: probes a 1-layer twin on meta; LongT5 still gets its attention_mask.
    model, args, kwargs = hf_model("longt5", META, None, layers=2)
    assert model.config.num_layers == 2
    named = named_inputs(model, args, kwargs)
    assert tuple(named["attention_mask"].shape) == (1, 128)


@pytest.mark.parametrize(("model_type", "built"), [
    ("blip_text_model", "BlipTextModel"),  # declared in modeling_blip_text, imported in _blip
    ("sam_mask_decoder", "SamMaskDecoder"),  # no model class: the module named as the config
    ("idefics_vision", "IdeficsVisionTransformer"),  # the outermost of two that take it alone
])
def test_a_sub_model_config_in_no_auto_table_builds_its_own_class(model_type, built):
    from exportflops.hf.models import build

    config = tf.AutoConfig.for_model(model_type)
    assert type(build(config, META, tf)).__name__ == built


class AfterABranch(torch.nn.Module):
    """Reads an optional input after a branch on a value, as Moshi's depth decoder reads its
    last_hidden_state after a branch on each position."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, states=None):
        if x.sum() > 0:
            x = self.proj(x)
        return x + states.sum(-1, keepdim=True)


def test_an_input_read_after_a_branch_on_values_is_found_on_a_real_device():
    x = torch.ones(2, 4)
    error = fake_error(AfterABranch(), (x,), {}, past_values=True)
    assert needed_input(error, ["states"]) == "states"
    # Only the search for inputs runs the forward; on meta nothing decides the branch.
    assert fake_error(AfterABranch(), (x,), {}) is None
    assert fake_error(AfterABranch().to(META), (x.to(META),), {}, past_values=True) is None
