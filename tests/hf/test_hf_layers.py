"""``--layers N`` keeps the fields that point into a stack inside it (issue 12): a capped model
builds and runs as the full one does.

Fields of transformers 5.23's default configs: Depth Anything's DINOv2 backbone has 12 layers
and outputs stages [9, 10, 11, 12]; ViTPose's outputs stage [4] of 12; VipLLaVA reads the
vision tower's hidden states (-2, -5, -8, -11, 6) of 24 layers; DepthPro hooks layers (11, 5)
of its 12-layer image encoder; LLaVA reads hidden state -2 of 24 layers.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.layers import cap_layers

tf = pytest.importorskip("transformers")
META = torch.device("meta")


def _capped(model_type: str, layers: int):
    config = tf.AutoConfig.for_model(model_type)
    cap_layers(config, layers)
    return config


def test_a_backbone_keeps_one_layer_per_stage_its_head_reads():
    # Four distinct stages cannot fit in two layers (stem, stage1, stage2); transformers
    # refuses a stage read twice. So four layers, the last four stages.
    backbone = _capped("depth_anything", 2).backbone_config
    assert backbone.num_hidden_layers == 4
    assert backbone.out_indices == [1, 2, 3, 4]
    assert backbone.out_features == ["stage1", "stage2", "stage3", "stage4"]
    assert backbone.stage_names == ["stem", "stage1", "stage2", "stage3", "stage4"]


def test_a_backbone_stage_past_the_end_is_the_last():
    backbone = _capped("vitpose", 2).backbone_config
    assert backbone.num_hidden_layers == 2
    assert backbone.out_indices == [2]  # stage 4 of 12 layers -> stage 2, the last of 2


def test_hidden_state_indices_past_the_end_move_to_the_ends_and_keep_their_count():
    # 2 layers: hidden states are the embeddings and two layers' outputs, indices -3..2; the
    # last layer is 1 (from the start) and the first -2 (from the end). -2 stays; -5, -8 and
    # -11 move to -2; 6 moves to 1. Five features still, as VipLLaVA's projector reads five.
    config = _capped("vipllava", 2)
    assert config.vision_feature_layers == (-2, -2, -2, -2, 1)


def test_layer_indices_past_the_end_are_the_last_layer():
    # DepthPro reads hidden_states[hook + 1]: hooks 11 and 5 of 12 layers -> 1, the last of 2.
    config = _capped("depth_pro", 2)
    assert list(config.intermediate_hook_ids) == [1, 1]


def test_an_index_inside_the_capped_stack_is_left_as_it_is():
    assert _capped("llava", 2).vision_feature_layer == -2
    assert list(_capped("depth_pro", 12).intermediate_hook_ids) == [11, 5]


@pytest.mark.parametrize("model_type", ["depth_anything", "vitpose", "vipllava", "depth_pro"])
def test_models_that_point_into_their_stacks_analyze_with_two_layers(model_type):
    report = analyze(*hf_model(model_type, META, None, layers=2))
    assert report.total.flops > 0 and not report.uncounted


def test_a_stack_of_stages_sized_by_tuples_keeps_its_stages():
    # Muse Spark's audio encoder: 4 stages (num_hidden_layers 4) of hidden_sizes (256, 512,
    # 1024, 2048) and patch_sizes (16, 6, 5, 4); 2 stages of 4 sizes would not fit together.
    config = tf.AutoConfig.for_model("muse_spark_audio")
    cap_layers(config, 2)
    assert config.num_hidden_layers == 4 and config.hidden_sizes == (256, 512, 1024, 2048)
    report = analyze(*hf_model("muse_spark_audio", META, None, layers=2))
    assert report.uncounted == [] and report.total.flops > 0
    # A stack with no such tuples is still cut (Llama: 32 layers to 2).
    llama = tf.AutoConfig.for_model("llama")
    cap_layers(llama, 2)
    assert llama.num_hidden_layers == 2


def test_a_vision_tower_counting_its_blocks_in_depth_is_capped():
    # Qwen2-VL's vision tower: depth 32, and no field named like a layer count.
    config = tf.AutoConfig.for_model("qwen2_vl_vision")
    cap_layers(config, 2)
    assert config.depth == 2
    # Beside a layer count, depth is something else (Janus's aligner: depth 2 of 24 layers).
    janus = tf.AutoConfig.for_model("janus_vision_model")
    depth = janus.depth
    cap_layers(janus, 1)
    assert janus.num_hidden_layers == 1 and janus.depth == depth


def test_a_count_of_the_stacks_last_layers_stays_inside_it():
    # EoMT's last num_blocks = 4 of 24 layers also attend to its queries, which join at layer
    # 24 - 4; at 2 layers, 2 - 4 is no layer and the queries would never join.
    config = tf.AutoConfig.for_model("eomt")
    cap_layers(config, 2)
    assert (config.num_hidden_layers, config.num_blocks) == (2, 2)
    sapiens = tf.AutoConfig.for_model("sapiens2")  # its last 8 of 24 attend to every token
    cap_layers(sapiens, 2)
    assert sapiens.num_last_full_attention_layers == 2
    # Inside the capped stack already: left as it is.
    config = tf.AutoConfig.for_model("eomt")
    cap_layers(config, 12)
    assert config.num_blocks == 4


def test_a_siblings_indices_named_for_a_capped_stack_stay_inside_it():
    # Molmo2's adapter_config reads vision_config's 25 layers at vision_feature_layer [24, 18]:
    # both past 2 layers, so the last, 1.
    config = tf.AutoConfig.for_model("molmo2")
    cap_layers(config, 2)
    assert config.vision_config.num_hidden_layers == 2
    assert config.adapter_config.vision_feature_layer == [1, 1]


@pytest.mark.parametrize(("model_type", "fields"), [
    ("moonshine", ("encoder_num_hidden_layers", "decoder_num_hidden_layers")),  # 6 and 6
    ("vit_mae", ("num_hidden_layers", "decoder_num_hidden_layers")),  # 12 and 8
    ("esmfold2", ("folding_trunk_num_hidden_layers",)),  # 24
])
def test_a_named_stacks_num_hidden_layers_is_capped_too(model_type, fields):
    config = tf.AutoConfig.for_model(model_type)
    cap_layers(config, 2)
    assert [getattr(config, field) for field in fields] == [2] * len(fields)
