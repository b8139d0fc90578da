"""``hf:`` across the families transformers builds (issue 12's acceptance): each type from its
default config, capped at one layer per stack, on meta, built with the command's builder and
analyzed with no uncounted op. The full sweep over every registered type is
``benchmarks/hf_types.py``; this is a bounded sample of each family.

A type whose default config transformers itself cannot build is reported as transformers'
failure, not ours.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model, raised_by
from exportflops.errors import BuildError

tf = pytest.importorskip("transformers")
META = torch.device("meta")

FAMILIES = {
    "decoder LM": ["llama", "gpt2", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "falcon",
                   "gpt_neox", "opt", "bloom", "codegen", "starcoder2", "cohere", "olmo2"],
    "mixture of experts": ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss",
                           "granitemoe"],
    "state space and linear attention": ["falcon_h1", "qwen3_5_text"],
    "encoder": ["bert", "roberta", "distilbert", "albert", "electra", "deberta-v2",
                "modernbert"],
    "encoder-decoder": ["t5", "bart", "mbart", "pegasus", "whisper"],
    "vision": ["vit", "deit", "beit", "dinov2", "convnext", "resnet", "swin", "regnet",
               "mobilenet_v2", "segformer", "yolos"],
    "audio": ["wav2vec2", "hubert", "wavlm", "sew"],
    "multimodal": ["clip", "siglip", "blip", "owlvit", "chinese_clip", "paligemma",
                   "unlimited_ocr_text"],
    "sub-model config": ["clip_text_model", "clip_vision_model", "siglip_vision_model",
                         "align_vision_model", "blip_vision_model", "owlv2_vision_model",
                         # a class imported from a sibling module; a module, not a model class
                         "blip_text_model", "idefics_vision"],
}
TYPES = [t for types in FAMILIES.values() for t in types]


def test_the_sample_spans_the_families():
    assert len(TYPES) >= 40 and len(set(TYPES)) == len(TYPES)
    assert all(t in tf.CONFIG_MAPPING for t in TYPES)


@pytest.mark.parametrize("model_type", TYPES)
def test_each_type_is_analyzed_with_every_op_counted(model_type):
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    report = analyze(model, args, kwargs)
    assert report.uncounted == [], [(u.op, u.reason) for u in report.uncounted]
    assert report.coverage == 1.0 and report.total.macs > 0


#: A type whose default config transformers' own constructor fails on, per release.
UNBUILDABLE = {
    "5.23.": "dbrx",  # its config lacks an attribute its own model reads
    # Its text config's mlp_layer_types defaults to None, which its decoder layers index.
    "5.24.": "deepseek_ocr2",
}


@pytest.mark.skipif(not any(tf.__version__.startswith(v) for v in UNBUILDABLE),
                    reason="no default config known to fail in this transformers release")
def test_a_config_transformers_cannot_build_is_blamed_on_transformers():
    model_type = next(t for v, t in UNBUILDABLE.items() if tf.__version__.startswith(v))
    with pytest.raises(BuildError) as failed:
        hf_model(model_type, META, None, layers=1)
    assert f"transformers could not build {model_type}" in str(failed.value)
    assert raised_by(failed.value).startswith("transformers (")


@pytest.mark.skipif("gemma4_unified_vision" not in tf.CONFIG_MAPPING,
                    reason="Gemma 4 Unified is registered from transformers 5.23")
def test_a_config_with_no_model_class_is_transformers_not_ours():
    # Gemma 4 Unified's vision config sizes an embedder that also takes the text config
    # (Gemma4UnifiedVisionEmbedder(vision_config, text_config)): transformers builds no model
    # from it alone, so the type is one transformers cannot build.
    from exportflops.hf.models import blame

    with pytest.raises(BuildError, match="has no model class for Gemma4UnifiedVisionConfig"
                       ) as failed:
        hf_model("gemma4_unified_vision", META, None, layers=1)
    assert blame(failed.value) == "theirs"


def test_a_vision_language_model_is_built_with_its_language_head():
    # LlavaConfig's default text model is Llama's: hidden_size 4096, vocab_size 32000. The head
    # maps each of the 128 tokens to the vocabulary: 2 x 128 x 4096 x 32000 FLOPs. AutoModel's
    # LlavaModel has no head; LlavaForConditionalGeneration, the model that generates, has.
    model, args, kwargs = hf_model("llava", META, None, layers=1)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert args[0].shape == (1, 128)
    head = next(m for m in analyze(model, args, kwargs).modules if m.path == "lm_head")
    assert head.inclusive.flops == 2 * 128 * 4096 * 32000
