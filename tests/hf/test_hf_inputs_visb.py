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
its default image (224 / patch_size 16 = 14 a side) 14 x 14 = 196 tokens, more than the text's;
Molmo2, as its image processor cuts an image of the tower's image_size 378:
two crops (low resolution, and its one tile) of 27 x 27 = 729 patches of 3 x 14 x 14 = 588
pixels, each pooled 2 x 2 (the processor's pooling_size) into ceil(27 / 2) = 14 x 14 tokens: 2 x
196 = 392 image tokens, before the text's 128; its adapter reads two of the tower's layers
(vision_feature_layer [24, 18] of 25, both moved inside the capped tower), 2 x 1152 features a
patch.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.inputs import HF_DEFAULT_SEQ_LEN
from exportflops.hf.sizes import windowed_side
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
    "molmo2": {"input_ids": (1, 392 + SEQ), "pixel_values": (2, 729, 588),
               "image_token_pooling": (392, 4), "image_grids": (1, 4), "image_num_crops": (1,)},
    # Read from the composite, which calls it.
    "molmo2_adapter": {"image_features": (2, 729, 2 * 1152), "pooled_patches_idx": (392, 4)},
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
    from exportflops.hf.inputs import _patch_inputs

    config = tf.AutoConfig.for_model("video_llama_3")
    inputs = {}
    _patch_inputs(inputs, "pixel_values", "image_grid_thw", {"image_merge_sizes"}, config,
                  torch.device("cpu"), batch=2)
    assert inputs["image_merge_sizes"].tolist() == [1, 1]
    assert inputs["image_grid_thw"].shape == (2, 3)


def test_a_seq_too_short_for_the_images_tokens_is_a_usage_error():
    # MiniMax-M3-VL's image: 2016 / 14 = 144 patches a side, merged 2 x 2: 72 x 72 = 5184
    # tokens, more than seq=128 holds.
    from exportflops.errors import UsageError

    with pytest.raises(UsageError, match=r"seq=128: .* 5184 tokens .* seq=5184 or more"):
        hf_model("minimax_m3_vl", META, None, layers=1, seq=128)


def test_molmo2s_crops_pool_their_patches_by_index_and_the_sizes_are_measured(tmp_path):
    # A tiny Molmo2 on cpu at batch 2: image_size 42 in patches of 14, so 3 x 3 patches a crop,
    # pooled 2 x 2 into 2 x 2 tokens (the grid padded with -1 below and right); 2 crops an
    # image, 8 tokens; the second crop's patches follow the first's 9.
    tf.Molmo2Config(
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                       "image_size": [42, 42], "patch_size": 14},
        adapter_config={"vision_feature_layer": [-1], "hidden_size": 16,
                        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                        "intermediate_size": 32, "text_hidden_size": 32},
        text_config={"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 8, "vocab_size": 256, "additional_vocab_size": 128,
                     "num_hidden_layers": 1, "intermediate_size": 64},
        image_start_token_id=300, low_res_image_start_token_id=301, image_end_token_id=302,
        image_patch_id=303, frame_start_token_id=304, frame_end_token_id=305,
    ).save_pretrained(tmp_path)
    model, args, kwargs = hf_model(str(tmp_path), torch.device("cpu"), None, batch=2)
    crop = [[0, 1, 3, 4], [2, -1, 5, -1], [6, 7, -1, -1], [8, -1, -1, -1]]
    second = [[i + 9 if i >= 0 else -1 for i in cell] for cell in crop]
    assert kwargs["image_token_pooling"][:8].tolist() == crop + second
    assert kwargs["image_token_pooling"][8:9].tolist() == [[18, 19, 21, 22]]  # image 2
    assert kwargs["image_grids"].tolist() == [[2, 2, 2, 2]] * 2
    assert (args[0] == 303).sum(dim=1).tolist() == [8, 8]
    report = analyze(model, args, kwargs)
    assert report.uncounted == [] and report.symbols == []
    # Measured on the example: 16 tokens pooled, 8 an image, 16 x 32 features scattered.
    measured = sorted(int(guard.rstrip(")").split(", ")[1]) for guard in report.value_guards)
    assert measured == [8, 8, 16, 16 * 32]
    # The adapter's 16 tokens: pooling attention (one query over 4 patches, 2 heads of 8)
    # with q and o 16 x 16 a token, k and v 16 x 16 a patch; then the projector 16 -> 2 x 32
    # -> 32.
    pooling = 16 * (2 * 16 * 16 + 2 * 4 * 16 * 16 + 2 * 2 * 4 * 8)
    assert report.module("model.multi_modal_projector").inclusive.macs == (
        pooling + 16 * (2 * 16 * 32 + 32 * 32))
