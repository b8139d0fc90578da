"""Sub-models whose inputs another model computes (issue 12): SAM's mask decoder and prompt
encoder, SAM 3's DETR stacks. Their example inputs are read from the composite model that
holds them (`exportflops.hf.parent`), and a few generic input names are made from the
config.

Sizes from transformers 5.23's default SAM config: the vision tower's image_size 1024 and
patch_size 16 give a 1024 / 16 = 64 x 64 grid of output_channels 256; the prompt encoder's
hidden_size is 256. Perceiver's d_model is 768; DepthPro's patch_size 384 and smallest
scaled-image ratio 0.25 ask for 384 / 0.25 = 1536-pixel images.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.errors import UsageError
from tests.cli_support import named_inputs

tf = pytest.importorskip("transformers")
META = torch.device("meta")


def test_a_mask_decoder_gets_the_image_embeddings_its_composite_computes():
    model, args, kwargs = hf_model("sam_mask_decoder", META, None, layers=1, batch=2)
    inputs = named_inputs(model, args, kwargs)
    grid = 1024 // 16
    assert inputs["image_embeddings"].shape == (2, 256, grid, grid)
    assert inputs["image_positional_embeddings"].shape == (2, 256, grid, grid)
    # Fresh zeros on the model's device, not the fake tensors of the composite's run.
    assert type(inputs["image_embeddings"]) is torch.Tensor
    assert inputs["image_embeddings"].device == META


def test_a_mask_decoder_alone_costs_what_it_costs_inside_its_composite():
    # The same decoder config, inputs read from SamModel: the standalone analysis and the
    # mask_decoder row of the composite's analysis are two countings of one computation.
    alone = analyze(*hf_model("sam_mask_decoder", META, None, layers=1))
    whole = analyze(*hf_model("sam", META, None, layers=1))
    inside = next(m for m in whole.modules if m.path == "mask_decoder")
    assert alone.total.flops == inside.inclusive.flops > 0
    assert not alone.uncounted


def test_a_module_built_from_the_whole_composite_config_is_taken_from_the_composite():
    # SamPromptEncoder's constructor takes the whole SamConfig: no class takes its own config
    # alone but the smaller SamMaskEmbedding, which is not it.
    model, args, kwargs = hf_model("sam_prompt_encoder", META, None, layers=1)
    assert type(model).__name__ == "SamPromptEncoder"
    assert not analyze(model, args, kwargs).uncounted


def test_a_composite_that_never_calls_the_sub_model_is_named_in_the_error(monkeypatch):
    # A stand-in composite (a Linear) that holds no ReLU, asked for a ReLU's inputs: its
    # forward, even asked again with its prompts, calls none.
    from exportflops.hf import parent as hf_parent

    class Holder:
        pass

    monkeypatch.setattr(hf_parent, "parent_configs", lambda config: [(Holder(), "relu_config")])
    composite = (torch.nn.Linear(2, 2), (torch.zeros(1, 2),), {})
    missing = UsageError("no input")
    with pytest.raises(UsageError, match=r"^no input Nor could it be read .*Holder \(relu_config"
                       r"\): its forward did not call a ReLU\.$"):
        hf_parent.parent_inputs(torch.nn.ReLU(), None, META, lambda config: composite, missing)


@pytest.mark.parametrize("model_type",
                         ["sam3_geometry_encoder", "sam3_lite_text_geometry_encoder"])
def test_a_sub_model_run_only_on_prompts_gets_its_composites_prompt(model_type):
    # Sam3Model calls its geometry encoder only with box prompts (input_boxes), which its
    # example inputs (an image and text) do not hold: asked again with one box per example,
    # the encoder reads that box (batch 1, 1 box, cx cy w h) and the three FPN levels of
    # 1008 / 14 = 72 patches a side, scaled by 4, 2 and 1 (image features and positions).
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    named = named_inputs(model, args, kwargs)
    assert tuple(named["box_embeddings"].shape) == (1, 1, 4)
    assert tuple(named["box_mask"].shape) == (1, 1)
    assert [tuple(t.shape) for t in named["img_feats"]] == [
        (1, 256, 288, 288), (1, 256, 144, 144), (1, 256, 72, 72)]


@pytest.mark.parametrize("model_type", ["sam3_mask_decoder", "sam3_lite_text_mask_decoder"])
def test_a_sub_model_is_reached_where_a_plain_fake_run_stops_on_a_value(model_type):
    # SAM 3's DETR decoder sizes a mask by its feature map's spatial_shapes (a tensor) before
    # the mask decoder runs: torch.export traces past it. The decoder reads the vision tower's
    # three FPN levels: 1008 / 14 = 72 patches a side, scaled by 4, 2 and 1.
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    shapes = {tuple(t.shape) for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)}
    shapes |= {tuple(t.shape) for v in kwargs.values() if isinstance(v, (list, tuple))
               for t in v}
    assert {(1, 256, 288, 288), (1, 256, 144, 144), (1, 256, 72, 72)} <= shapes
    assert not analyze(model, args, kwargs).uncounted


@pytest.mark.parametrize("model_type", ["sam3_detr_encoder", "sam3_detr_decoder"])
def test_detr_stacks_of_sam3_are_analyzed(model_type):
    report = analyze(*hf_model(model_type, META, None, layers=1))
    assert report.total.flops > 0 and not report.uncounted


def test_xmod_gets_a_language_per_example_where_its_config_sets_no_default():
    model, args, kwargs = hf_model("xmod", META, None, layers=1, batch=3, seq=16)
    assert kwargs["lang_ids"].shape == (3,)
    assert kwargs["lang_ids"].dtype == torch.long
    assert not analyze(model, args, kwargs).uncounted


def test_perceiver_reads_vectors_of_d_model():
    model, args, kwargs = hf_model("perceiver", META, None, layers=1, seq=32)
    assert named_inputs(model, args, kwargs)["inputs"].shape == (1, 32, 768)


def test_a_speech_encoder_decoder_takes_its_encoders_waveform():
    model, args, kwargs = hf_model("speech-encoder-decoder", META, None, layers=1)
    # wav2vec2's input_values (a parameter of forward too, beside the generic `inputs`): one
    # second at 16 kHz (HF_DEFAULT_SAMPLES).
    assert named_inputs(model, args, kwargs)["input_values"].shape == (1, 16_000)
    assert "decoder_input_ids" in kwargs


def test_depth_pro_images_fit_its_smallest_scaling():
    model, args, kwargs = hf_model("depth_pro", META, None)
    assert named_inputs(model, args, kwargs)["pixel_values"].shape[-2:] == (1536, 1536)


def test_lxmert_reads_36_detector_regions_of_its_feature_and_box_widths():
    # visual_feat_dim 2048 and visual_pos_dim 4 (LXMERT's default config); 36 objects per image
    # (Tan & Bansal 2019).
    model, args, kwargs = hf_model("lxmert", META, None, layers=1, batch=2, seq=8)
    assert kwargs["visual_feats"].shape == (2, 36, 2048)
    assert kwargs["visual_pos"].shape == (2, 36, 4)
    assert not analyze(model, args, kwargs).uncounted


def test_a_vq_gan_image_is_its_latent_grid_scaled_by_its_stages():
    # Janus' VQ-GAN: num_patches 32 a side, channel_multiplier (1, 1, 2, 2, 4): four stages
    # that halve, so 32 x 2^4 = 512 pixels; its decoder checks for 32 x 32 = 1024 tokens.
    model, args, kwargs = hf_model("janus_vqgan", META, None, layers=1)
    assert args[0].shape[-2:] == (512, 512)
    assert not analyze(model, args, kwargs).uncounted


def test_a_second_tower_of_high_resolution_gets_its_own_images():
    # DeepSeek-VL-Hybrid's forward wants both or neither; its high_res_vision_config has
    # image_size 1024, the low-resolution tower 224.
    model, args, kwargs = hf_model("deepseek_vl_hybrid", META, None, layers=1)
    assert kwargs["pixel_values"].shape[-2:] == (224, 224)
    assert kwargs["high_res_pixel_values"].shape[-2:] == (1024, 1024)


def test_spectrograms_of_windowed_encoders_are_whole_windows():
    # Qwen3-ASR cuts its features into windows of 2 x n_window (50) = 100 frames: the default
    # 128 frames round up to 200; a config with no windows keeps 128 (HF_DEFAULT_FRAMES).
    from types import SimpleNamespace

    from exportflops.hf.media import spectrogram_frames

    assert spectrogram_frames(SimpleNamespace(n_window=50), None, bins_first=False) == 200
    assert spectrogram_frames(SimpleNamespace(), None, bins_first=False) == 128
    assert spectrogram_frames(SimpleNamespace(n_window=50), 96, bins_first=False) == 96


def test_mllamas_vision_tower_gets_one_image_of_tiles_and_its_aspect_ratio():
    # MllamaVisionConfig: max_num_tiles 4, image_size 448, num_channels 3; one image per
    # example, its aspect-ratio id and the mask of its tiles.
    model, args, kwargs = hf_model("mllama_vision_model", META, None, layers=1, batch=2)
    assert args[0].shape == (2, 1, 4, 3, 448, 448)
    assert kwargs["aspect_ratio_ids"].shape == (2, 1)
    assert kwargs["aspect_ratio_mask"].shape == (2, 1, 4)
    assert not analyze(model, args, kwargs).uncounted


def test_decision_transformer_reads_a_trajectory_of_states_actions_and_returns():
    # DecisionTransformerConfig: state_dim 17 and act_dim 4 (Hopper's); a return-to-go is one
    # number; timesteps index the episode. --seq sets the steps.
    model, args, kwargs = hf_model("decision_transformer", META, None, layers=1, seq=20)
    inputs = named_inputs(model, args, kwargs)
    assert inputs["states"].shape == (1, 20, 17)
    assert inputs["actions"].shape == (1, 20, 4)
    assert inputs["returns_to_go"].shape == (1, 20, 1)
    assert inputs["timesteps"].shape == (1, 20) and inputs["timesteps"].dtype == torch.long
    assert not analyze(model, args, kwargs).uncounted


def test_gemma3n_audio_reads_a_spectrogram_and_a_boolean_mask_of_its_frames():
    # Gemma3nAudioConfig: input_feat_size 128 mel bins; forward annotates audio_mel_mask a
    # torch.BoolTensor (torch.where's predicate). --seq 64 frames.
    model, args, kwargs = hf_model("gemma3n_audio", META, None, layers=1, seq=64)
    inputs = named_inputs(model, args, kwargs)
    assert inputs["audio_mel"].shape == (1, 64, 128)
    assert inputs["audio_mel_mask"].shape == (1, 64)
    assert inputs["audio_mel_mask"].dtype == torch.bool
    assert not analyze(model, args, kwargs).uncounted


def test_a_sub_model_whose_composites_transformers_cannot_build_is_transformers_failure():
    # EdgeTAM's composite needs timm where it is not installed: no composite is built, so the
    # failure is transformers' (BuildError, exit 1), with the composite's reason.
    from exportflops.hf.models import blame
    from exportflops.hf.inputs import UnknownInputError
    from exportflops.hf.parent import parent_inputs
    from exportflops.errors import BuildError

    config = tf.SamMaskDecoderConfig()
    model = tf.models.sam.modeling_sam.SamMaskDecoder(config)

    def unbuildable(parent_config):
        raise BuildError(f"transformers could not build {parent_config.model_type}: ImportError")

    missing = UnknownInputError("exportflops does not know how to make 'image_embeddings'.")
    with pytest.raises(BuildError, match=r"SamConfig \(mask_decoder_config\): BuildError: "
                                         r"transformers could not build sam") as failed:
        parent_inputs(model, config, META, unbuildable, missing)
    assert blame(failed.value) == "theirs"


def test_a_composite_that_calls_the_sub_model_at_a_value_read_size_is_a_reasonnamed_inputs():
    # A composite that sizes the sub-model's input by a tensor's values (BLT's patches): the
    # call is reached under torch.export with a size no example has, which the error names
    # beside the input that hf: could not make.
    from exportflops.hf.inputs import UnknownInputError
    from exportflops.hf.parent import parent_inputs

    class Held(torch.nn.Module):
        def forward(self, patches):
            return patches * 2

    class Composite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.held = Held()

        def forward(self, x):
            return self.held(x.nonzero().float())  # as many rows as x has nonzeros

    def make(_parent_config):
        return Composite(), (torch.ones(4),), {}

    missing = UnknownInputError("exportflops does not know how to make an example 'patches'.")
    with pytest.raises(UsageError, match=r"'patches'.*SamConfig \(mask_decoder_config\): "
                                         r"UsageError: a size of this input depends on the "
                                         r"composite model's values \(u\d+\)") as failed:
        parent_inputs(Held(), tf.SamMaskDecoderConfig(), META, make, missing)
    assert "\n" not in str(failed.value)
