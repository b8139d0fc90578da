"""Example inputs ``hf:`` makes beyond tokens and images: videos, spectrograms in each layout,
time series, and the inputs a forward requires or asks for; each model then analyzes with no
uncounted op.

Shapes come from transformers' default configs (the published sizes of each architecture,
transformers 5.23): VideoMAE reads 16 frames of 224 x 224 x 3 (num_frames, image_size,
num_channels), TimeSformer 8; X-CLIP's vision tower 8 frames, as a batch of images; AST a
spectrogram of max_length 1,024 frames x num_mel_bins 128; Parakeet 80 mel bins, frames first;
wav2vec2-BERT two stacked frames of 80 bins (feature_projection_input_dim 160); Granite Speech's
encoder input_dim 160; CLAP's audio tower one channel (patch_embed_input_channels) of 64 bins;
PatchTST context_length 32 of num_input_channels 1; TimesFM context_length 512; BROS 512
positions (so 128 tokens) with a box each; BLIP-2's Q-Former cross-attends to states of
encoder_hidden_size 1,408; the codecs (EnCodec's audio_channels 1, DAC mono) one second of
16 kHz waveform with a channel axis; Idefics2 a list of one 224 x 224 x 3 image per example.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.media import HF_DEFAULT_FRAMES
from exportflops.errors import UsageError
from tests.cli_support import input_shapes

tf = pytest.importorskip("transformers")
META = torch.device("meta")

# model type -> {input name: shape} at one layer, batch 1, default seq.
CASES = {
    # Videos: (batch, frames, channels, height, width).
    "videomae": {"pixel_values": (1, 16, 3, 224, 224)},
    "timesformer": {"pixel_values": (1, 8, 3, 224, 224)},
    "xclip_vision_model": {"pixel_values": (1 * 8, 3, 224, 224)},
    # Spectrograms: frames first, bins as channels (whisper, in test_hf_command), or an image.
    "audio-spectrogram-transformer": {"input_values": (1, 1024, 128)},
    "parakeet_encoder": {"input_features": (1, HF_DEFAULT_FRAMES, 80)},
    "wav2vec2-bert": {"input_features": (1, HF_DEFAULT_FRAMES, 160)},
    "granite_speech_encoder": {"hidden_states": (1, HF_DEFAULT_FRAMES, 160)},
    "clap_audio_model": {"input_features": (1, 1, HF_DEFAULT_FRAMES, 64)},
    # Waveforms: (batch, samples) for wav2vec2 (test_hf_command), a channel axis for codecs.
    "encodec": {"input_values": (1, 1, 16_000)},
    "dac": {"input_values": (1, 1, 16_000)},
    # Images as a list per example: (batch, images, channels, height, width).
    "idefics2": {"pixel_values": (1, 1, 3, 224, 224)},
    # Time series: (batch, context_length[, channels]); TimesFM's frequency class per series.
    "patchtst": {"past_values": (1, 32, 1)},
    "timesfm": {"past_values": (1, 512), "past_values_padding": (1, 512), "freq": (1, 1)},
    # Inputs the forward's code requires though its signature makes them optional.
    "bros": {"input_ids": (1, 128), "bbox": (1, 128, 4)},
    "blip_2_qformer": {"query_embeds": (1, 128, 768), "encoder_hidden_states": (1, 128, 1408)},
    # Qwen3-ASR: bins first (num_mel_bins 128), frames in whole windows of 2 x n_window 50, so
    # 128 rounded up to 200; its optional mask over those frames, which its forward reads.
    "qwen3_asr": {"input_features": (1, 128, 200), "input_features_mask": (1, 200)},
    # SigLIP 2's NaFlex patches: num_patches 256 (16 x 16) of 3 x 16 x 16 pixels, their mask,
    # and the grid of each image.
    "siglip2_vision_model": {"pixel_values": (1, 256, 768), "pixel_attention_mask": (1, 256),
                             "spatial_shapes": (1, 2)},
    # The Qwen-Omni audio encoders take the examples' frames concatenated, bins first with no
    # batch axis (their thinkers gather them by the mask), and each example's length, which
    # forward reads while None: num_mel_bins 128 x twice max_source_positions 1500.
    "qwen2_5_omni_audio_encoder": {"input_features": (128, 3000), "feature_lens": (1,)},
    "qwen3_omni_moe_audio_encoder": {"input_features": (128, 3000), "feature_lens": (1,)},
    # Granite Speech 5: frames first, each 4 stacked frames of num_mel_bins 80 (its
    # input_linear reads num_mel_bins * 4; its feature extractor stacks them).
    "granite_speech5_encoder": {"input_features": (1, HF_DEFAULT_FRAMES, 4 * 80)},
    # IDEFICS: which of its images (one per example) each of the 128 tokens attends to.
    "idefics": {"pixel_values": (1, 1, 3, 224, 224), "image_attention_mask": (1, 128, 1)},
}


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_input_family_is_shaped_from_its_config(model_type):
    assert input_shapes(model_type, CASES[model_type]) == CASES[model_type]


@pytest.mark.parametrize("model_type", ["videomae", "audio-spectrogram-transformer",
                                        "parakeet_encoder", "clap_audio_model", "patchtst",
                                        "bros", "dac", "idefics", "granite_speech5_ctc"])
def test_the_model_then_analyzes_with_every_op_counted(model_type):
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    report = analyze(model, args, kwargs)
    assert report.total.flops > 0
    assert report.uncounted == []


def test_a_required_input_it_cannot_make_is_named_in_a_usage_error(monkeypatch):
    """DeepSeek-OCR2's vision encoder requires num_patches, the image's patches ahead of its
    queries, which no field of its own config counts: hf: reads them off the SAM tower of the
    composite holding it (tests/hf/test_hf_task_inputs.py); without that rule the input is
    refused by name. (ESMFold2's token_index, Qwen2-VL's grid_thw and Decision Transformer's
    states, once refused here, are made too: tests/hf/test_hf_task_inputs.py,
    tests/hf/test_hf_needs.py, tests/hf/test_hf_parent.py.)"""
    from exportflops.hf import images as hf_image_inputs

    monkeypatch.setattr(hf_image_inputs, "patches_then_queries", lambda *a, **k: None)
    with pytest.raises(UsageError, match="'num_patches'.*kwargs="):
        hf_model("deepseek_ocr2_encoder", META, None, layers=1)


def test_siglip2_is_analyzed_with_its_position_resize_counted_or_named_uncounted():
    from packaging.version import Version

    report = analyze(*hf_model("siglip2", META, None, layers=1))
    assert report.total.macs > 0
    if Version(tf.__version__) < Version("5.24"):
        # Before transformers 5.24: SigLIP 2 resizes its position embeddings to each image's
        # grid, read from spatial_shapes' values: a size export cannot know, so that one
        # resize is reported uncounted, not zero.
        assert [u.op for u in report.uncounted] == ["aten._upsample_bilinear2d_aa.vec"]
        assert "spatial_shapes" in report.uncounted[0].reason
        return
    # Since 5.24 the resize is a matmul of each output position's bilinear weights over the
    # 16 x 16 grid by the grid's embeddings: 1 x 256 positions x 256 x 768 MACs, by hand.
    assert report.uncounted == []
    resize = [n.cost.macs for n in report.nodes if n.module == "vision_model.embeddings"
              and n.op == "aten.matmul.default"]
    assert resize == [1 * 256 * 256 * 768]


def test_concatenated_frames_come_with_each_examples_length(tmp_path):
    # Qwen2.5-Omni's audio encoder: num_mel_bins 16 bins first, the frames of both examples
    # concatenated: twice max_source_positions 20 = 40 each (whole windows of 2 x n_window 5).
    tf = pytest.importorskip("transformers")
    tf.Qwen2_5OmniAudioEncoderConfig(
        num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
        d_model=32, max_source_positions=20, n_window=5, output_dim=24).save_pretrained(tmp_path)
    model, args, kwargs = hf_model(str(tmp_path), torch.device("cpu"), None, batch=2)
    assert tuple(args[0].shape) == (16, 2 * 40)
    assert kwargs["feature_lens"].tolist() == [40, 40]
    report = analyze(model, args, kwargs)
    assert report.uncounted == [] and report.value_guards


def test_patches_as_one_batch_of_images_where_the_tower_unpacks_five_dimensions(tmp_path):
    # PaddleOCR-VL's vision tower unpacks (batch, patches, channels, patch, patch): its model
    # passes the patches so. image_size 56 in patches of 14: 4 x 4 = 16 patches.
    tf = pytest.importorskip("transformers")
    tf.AutoConfig.for_model(
        "paddleocr_vl_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, image_size=56, patch_size=14,
        spatial_merge_size=2).save_pretrained(tmp_path)
    model, args, kwargs = hf_model(str(tmp_path), torch.device("cpu"), None)
    assert tuple(args[0].shape) == (1, 16, 3, 14, 14)
    assert kwargs["grid_thw"].tolist() == [[1, 4, 4]]
    report = analyze(model, args, kwargs)
    # By hand: the patch embedding, a 14 x 14 convolution of 3 into 32 channels, 16 x 588 x 32;
    # the layer's q, k, v, o 4 x 16 x 32 x 32, its MLP 2 x 16 x 32 x 64, attention (QK and
    # AV) 2 x 16 x 16 x 32.
    assert report.total.macs == (16 * 588 * 32 + 4 * 16 * 32 * 32 + 2 * 16 * 32 * 64
                                 + 2 * 16 * 16 * 32)
    assert report.uncounted == []


class UnpacksImages(torch.nn.Module):
    """Unpacks images of one per example (SmolVLM's), then fails on their values' count, as
    SmolVLM's default config does in its pixel shuffle."""

    def forward(self, pixel_values):
        batch, images, channels, height, width = pixel_values.shape
        return pixel_values.view(batch * images, 7, -1)


def test_where_every_layout_fails_the_one_past_the_unpacking_is_told():
    from exportflops.hf.media import accepted

    images = torch.zeros((1, 3, 4, 4), device=META)
    one_each = torch.zeros((1, 1, 3, 4, 4), device=META)
    assert accepted(UnpacksImages(), "pixel_values", [images, one_each], {},
                    first=True) is one_each
