"""Example inputs of ``hf:`` model types that an op inside transformers rejected for their shape,
each now sized by the config field the model's own code reads for it; each model then analyzes
with every op counted.

Sizes from transformers 5.23's default configs, at batch 1 and the default length
HF_DEFAULT_SEQ_LEN = 128 where the length is a free choice:
LW-DETR's ViT encoder: image_size 256, patch_size 16 (16 x 16 = 256 patches), num_windows 16
windows in all (num_windows_side 4), hidden_size 768; RF-DETR's DINOv2 encoder: image_size 224,
patch_size 14 (16 x 16 = 256 patches), num_windows 4 a side (16 windows), hidden_size 768;
RF-DETR's backbone (DINOv2): image_size 518, patch_size 14, num_windows 4 a side, so 37 patches a
side, 36 in whole windows; Molmo2's vision tower: image_size 378, patch_size 14 (27 x 27 = 729
patches), num_channels 3, its patch embedding a linear layer over 3 x 14 x 14 = 588 pixels;
TVP: num_frames 48 of max_img_size 448 (its frame-pad prompt is built for frames of that side);
RAG: n_docs 5 documents per question, max_combined_length 300 tokens each; MiniMax-M3-VL's
vision tower: image_size 2016, patch_size 14 (144 x 144 = 20736 patches), temporal_patch_size
2, num_channels 3, spatial_merge_size 2 (72 x 72 = 5184 image tokens, more than the text's
128; its text's max_position_embeddings 524288 holds both); VideoLLaMA3's vision tower: no
spatial_merge_size, so one merge size per image of 1 (its image processor's merge_size), and
its default image (224 / patch_size 16 = 14 a side) 14 x 14 = 196 tokens, more than the text's.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.cli.hf import hf_model
from exportflops.cli.hf_inputs import HF_DEFAULT_SEQ_LEN
from exportflops.cli.hf_sizes import windowed_side
from exportflops.errors import ExportError
from tests.cli_support import analyzes_with_every_op_counted, input_shapes

tf = pytest.importorskip("transformers")
META = torch.device("meta")
SEQ = HF_DEFAULT_SEQ_LEN

# model type -> {input name: shape} at one layer, batch 1, default length.
CASES = {
    # 16 windows of 256 / 16 = 16 patches each.
    "lw_detr_vit": {"hidden_states": (16, 256 // 16, 768)},
    # 4 x 4 = 16 windows of 256 / 16 = 16 patches each.
    "rf_detr_dinov2": {"hidden_states": (4 * 4, 256 // 16, 768)},
    # 36 patches of 14 pixels a side: 504.
    "rf_detr": {"pixel_values": (1, 3, 36 * 14, 36 * 14)},
    "molmo2_vision": {"pixel_values": (1, 27 * 27, 3 * 14 * 14)},
    "tvp": {"pixel_values": (1, 48, 3, 448, 448)},
    # 5 contexts of 300 tokens for the one question; a score per document.
    "rag": {"context_input_ids": (1 * 5, 300), "context_attention_mask": (1 * 5, 300),
            "doc_scores": (1, 5), "decoder_input_ids": (1, SEQ)},
    # The image's 5184 tokens, then the text's 128; each patch 3 x 2 x 14 x 14 = 1176 pixels.
    "minimax_m3_vl": {"input_ids": (1, 72 * 72 + SEQ), "pixel_values": (144 * 144, 1176),
                      "image_grid_thw": (1, 3)},
    "video_llama_3_vision": {"merge_sizes": (1,), "grid_thw": (1, 3)},
    # The composite: the image's 196 tokens before the text's 128, and its merge size.
    "video_llama_3": {"image_merge_sizes": (1,), "input_ids": (1, 196 + SEQ)},
}
#: Those whose export on meta then fails in transformers' own code: LW-DETR's layers make their
#: layer scales with the legacy ``torch.Tensor(dim)``, which ignores the meta device (on cpu).
ON_CPU = {"lw_detr_vit"}
#: Those whose export then fails on data-dependent sizes: VideoLLaMA3's tower splits its patches
#: by the values of grid_thw (as the Qwen-VL family's does).
NOT_EXPORTED = {"video_llama_3_vision", "video_llama_3"}


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_input_is_shaped_from_its_config(model_type):
    assert input_shapes(model_type, CASES[model_type]) == CASES[model_type]


@pytest.mark.parametrize("model_type", [t for t in CASES if t not in NOT_EXPORTED])
def test_the_model_then_analyzes_with_every_op_counted(model_type):
    device = torch.device("cpu") if model_type in ON_CPU else META
    analyzes_with_every_op_counted(model_type, device)


def test_lw_detr_vit_fails_on_meta_only_for_its_cpu_layer_scales():
    # The shapes are right (the cpu run above analyzes); on meta the cpu parameter meets them.
    with pytest.raises(ExportError, match="meta and cpu"):
        analyze(*hf_model("lw_detr_vit", META, None, layers=1))


@pytest.mark.parametrize(("side", "expected"), [
    (518, 504),  # 37 patches of 14 a side; 36 in 4 windows
    (560, 560),  # 40 patches: 10 a window already
    (30, 56),    # fewer than one window: one window, 4 patches of 14
])
def test_a_side_is_rounded_to_whole_windows_of_whole_patches(side, expected):
    backbone = tf.AutoConfig.for_model("rf_detr").backbone_config  # patch 14, 4 windows a side
    assert windowed_side(side, backbone) == expected


def test_a_config_without_windows_keeps_its_side():
    assert windowed_side(518, tf.AutoConfig.for_model("dinov2")) == 518


def test_videollama3s_merge_of_patches_is_its_image_processors_one():
    # VideoLLaMA 3's forward reads image_merge_sizes while its grid is given; its image
    # processor merges 1 x 1 patches of a still image (merge_size = 1; 2 for videos). On cpu,
    # for the values.
    from exportflops.cli.hf_inputs import _patch_inputs

    config = tf.AutoConfig.for_model("video_llama_3")
    inputs = {}
    _patch_inputs(inputs, "pixel_values", "image_grid_thw", {"image_merge_sizes"}, config,
                  torch.device("cpu"), batch=2)
    assert inputs["image_merge_sizes"].tolist() == [1, 1]
    assert inputs["image_grid_thw"].shape == (2, 3)


def test_a_seq_too_short_for_the_images_tokens_is_a_usage_error():
    # MiniMax-M3-VL's image: 2016 / 14 = 144 patches a side, merged 2 x 2: 72 x 72 = 5184
    # tokens, more than --seq 128 holds.
    from exportflops.errors import UsageError

    with pytest.raises(UsageError, match=r"--seq 128: .* 5184 tokens .* --seq 5184 or more"):
        hf_model("minimax_m3_vl", META, None, layers=1, seq=128)
