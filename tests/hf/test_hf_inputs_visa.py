"""Image inputs of vision towers and vision-language models that the sweep blamed on
transformers while our example inputs had the wrong shape (`exportflops.hf.images`);
each model then analyzes with every op counted (or fails where only transformers' code is).

Sizes from transformers 5.23's default configs, at batch 1 and the default length
HF_DEFAULT_SEQ_LEN = 128: BridgeTower's vision tower takes its image as ``image``, image_size
288 of num_channels 3; Idefics2's perceiver resampler cross-attends to ``context`` of
hidden_size 4096; Kosmos-2.5's vision tower reads flattened_patches, 2048 (no seq_len in its
config) of patch_embed_hidden_size 768 plus a row and a column; Aria's projector looks its queries
up by patch count (projector_patch_to_query_dict {1225: 128, 4900: 256}) over a vision tower of
patch_size 32, image_token_index 9; Gemma 4's vision tower has patch_size 16,
pooling_kernel_size 3 and no image_size (224 assumed); Inkling's vision tower patch_size 40,
temporal_patch_size 2, num_channels 3, no image_size (224); Kimi-K2.5's vision tower patch_size
14, merge_kernel_size (2, 2), no image_size (224), a Conv2d(3, ...) per patch; Inkling 2's
vision tower patch_size 20, spatial_merge_size 2, num_channels 3, no image_size (224), its grid
counted in merged tokens.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.inputs import HF_DEFAULT_SEQ_LEN
from exportflops.hf.images import projector_images, token_blocks
from tests.cli_support import analyzes_with_every_op_counted, input_shapes

tf = pytest.importorskip("transformers")
META = torch.device("meta")
SEQ = HF_DEFAULT_SEQ_LEN

# model type -> {input name: shape} at one layer, batch 1, default length.
CASES = {
    # Images of image_size 288, under forward's own name for them.
    "bridgetower_vision_model": {"image": (1, 3, 288, 288)},
    # 128 states of hidden_size 4096, and a mask over them.
    "idefics2_perceiver": {"context": (1, SEQ, 4096), "attention_mask": (1, SEQ)},
    # 2048 patches, each a row, a column and 768 pixel values.
    "kosmos_2_5_vision_model": {"flattened_patches": (1, 2048, 2 + 768)},
    # The fewest patches the projector takes: isqrt(1225) = 35 a side, 35 x 32 = 1120 pixels.
    "aria": {"pixel_values": (1, 3, 35 * 32, 35 * 32), "input_ids": (1, SEQ)},
    # 224 / 16 = 14 patches a side, down to a multiple of 3: 12 x 12 = 144 patches, each
    # 3 x 16 x 16 = 768 values; an (x, y) per patch.
    "gemma4_vision": {"pixel_values": (1, 144, 768), "pixel_position_ids": (1, 144, 2)},
    # 224 // 40 = 5 patches a side, 25 clips of 2 frames of 40 x 40, channels last.
    "inkling_vision": {"pixel_values": (25, 2, 40, 40, 3)},
    "inkling_mm_model": {"pixel_values": (25, 2, 40, 40, 3), "input_ids": (1, SEQ)},
    # 224 // 14 = 16 patches a side (a multiple of the merge 2): 256 patches of 3 x 14 x 14.
    "kimi_k25_vision": {"pixel_values": (256, 3, 14, 14), "grid_thw": (1, 3)},
    # 224 // 20 = 11 patches a side, down to a multiple of 2: 10, merged 2 x 2: 5 x 5 = 25
    # tokens, each a block of 2 x 20 = 40 pixels a side, channels last.
    "inkling2_vision": {"pixel_values": (25, 40, 40, 3), "image_grid_thw": (1, 3)},
}
#: Those whose export then fails in transformers' own code, not for want of an input:
#: Kimi-K2.5 reads its grid's values (get_vision_frame_index: grid_thw.tolist()).
NOT_EXPORTED = {"kimi_k25_vision"}


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_image_input_is_shaped_from_its_config(model_type):
    assert input_shapes(model_type, CASES[model_type]) == CASES[model_type]


@pytest.mark.parametrize("model_type", [t for t in CASES if t not in NOT_EXPORTED])
def test_the_model_then_analyzes_with_every_op_counted(model_type):
    analyzes_with_every_op_counted(model_type)


def test_arias_tokens_hold_a_placeholder_per_query_of_its_projector():
    # 1225 patches -> 128 queries, each an image_token_index 9 at the front of the 128 tokens.
    config = tf.AutoConfig.for_model("aria")
    made = projector_images(config, torch.zeros((1, SEQ), dtype=torch.long))
    assert made["input_ids"].tolist() == [[9] * 128]
    assert tuple(made["pixel_values"].shape) == (1, 3, 1120, 1120)


def test_a_projector_table_with_more_queries_than_tokens_leaves_the_images_as_they_are():
    # 128 queries do not fit in 100 tokens: no placeholders, no resized images.
    config = tf.AutoConfig.for_model("aria")
    assert projector_images(config, torch.zeros((1, 100), dtype=torch.long)) == {}


def test_the_kimi_export_fails_in_transformers_reading_the_grid():
    from exportflops.errors import ExportError

    with pytest.raises(ExportError, match="data-dependent"):
        analyze(*hf_model("kimi_k25_vision", META, None, layers=1))


@pytest.mark.parametrize("model_type", ["gemma4_vision", "inkling_vision", "idefics2_perceiver"])
def test_two_layers_analyze_too(model_type):
    report = analyze(*hf_model(model_type, META, None, layers=2))
    assert not report.uncounted


def test_inkling2s_grid_counts_merged_tokens_not_patches():
    # 10 x 10 patches of 20 pixels, merged 2 x 2: a grid of (1, 5, 5), one 40 x 40 block each.
    vision = tf.AutoConfig.for_model("inkling2_vision")
    blocks, grid = token_blocks(vision, torch.device("cpu"), batch=1)
    assert grid.tolist() == [[1, 5, 5]]
    assert tuple(blocks.shape) == (5 * 5, 40, 40, 3)
