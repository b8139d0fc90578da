"""``hf:`` in the command: the model class transformers' auto tables give each model type, example
inputs sized from the config, --layers/--batch/--seq, local configs and the offline cache.

Shapes come from transformers' default configs (the published sizes of each architecture):
CLIP's text tower has 77 positions, whisper's feature extractor pads 30 s of audio to 3,000
frames of 80 mel bins (2 x max_source_positions 1,500), ViT-B/16 and CLIP ViT-B/32 read
224 x 224 images with 3 channels.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from exportflops import GenerationReport
from exportflops.hf.models import hf_model
from exportflops.errors import UsageError

from tests.cli_support import report_of, run

tf = pytest.importorskip("transformers")
META = torch.device("meta")

# model type -> (class hf: builds, {input name: shape}) at one layer, batch 1, default seq.
CASES = {
    # Decoder LMs, dense and MoE: 128 tokens (HF_DEFAULT_SEQ_LEN), fewer than their positions.
    "llama": ("LlamaForCausalLM", {"input_ids": (1, 128)}),
    "gpt2": ("GPT2LMHeadModel", {"input_ids": (1, 128)}),
    "mixtral": ("MixtralForCausalLM", {"input_ids": (1, 128)}),
    # Encoder-decoders get the decoder's tokens too; the seq2seq class, not BartForCausalLM.
    "t5": ("T5ForConditionalGeneration", {"input_ids": (1, 128), "decoder_input_ids": (1, 128)}),
    "bart": ("BartForConditionalGeneration",
             {"input_ids": (1, 128), "decoder_input_ids": (1, 128)}),
    "whisper": ("WhisperForConditionalGeneration",
                {"input_features": (1, 80, 2 * 1500), "decoder_input_ids": (1, 128)}),
    # Sub-model configs: in an auto table (clip_text_model) or in none (align_vision_model,
    # whose model class declares it as config_class).
    "clip_text_model": ("CLIPTextModel", {"input_ids": (1, 77)}),
    "align_vision_model": ("AlignVisionModel", {"pixel_values": (1, 3, 600, 600)}),
    # Vision, audio (one second of 16 kHz waveform), multimodal (text and pixels).
    "vit": ("ViTModel", {"pixel_values": (1, 3, 224, 224)}),
    "wav2vec2": ("Wav2Vec2Model", {"input_values": (1, 16_000)}),
    # CLIP's text ids are cut to its 77 positions (HF_DEFAULT_SEQ_LEN is 128).
    "clip": ("CLIPModel", {"input_ids": (1, 77), "pixel_values": (1, 3, 224, 224)}),
    "siglip": ("SiglipModel", {"input_ids": (1, 64), "pixel_values": (1, 3, 224, 224)}),
}


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_family_gets_its_class_and_inputs_from_its_config(model_type):
    expected_class, expected_inputs = CASES[model_type]
    model, args, kwargs = hf_model(model_type, META, None, layers=1)
    assert type(model).__name__ == expected_class
    forward = list(inspect.signature(model.forward).parameters)
    named = dict(zip(forward, args)) | kwargs
    got = {name: tuple(named[name].shape) for name in expected_inputs}
    assert got == expected_inputs
    assert kwargs.get("use_cache", False) is False


def test_layers_caps_every_stack_of_a_composite_config():
    """whisper's default has 4 encoder and 4 decoder layers; --layers 1 keeps one of each."""
    model, _, _ = hf_model("whisper", META, None, layers=1)
    assert len(model.model.encoder.layers) == 1 and len(model.model.decoder.layers) == 1
    model, _, _ = hf_model("clip", META, None, layers=1)  # 12 + 12 by default
    assert len(model.text_model.encoder.layers) == len(model.vision_model.encoder.layers) == 1


def test_a_seq_longer_than_the_positions_is_the_users_error():
    with pytest.raises(UsageError, match="77 positions"):
        hf_model("clip_text_model", META, None, layers=1, seq=128)


def test_batch_and_seq_reach_the_input_shape_and_the_counts():
    """GPT-2 default config, 1 layer, batch 2 x 16 tokens: per sequence the layer is
    qkv 16*768*2,304 + scores and values 2*12*16*16*64 + proj 16*768^2 + MLP 2*16*768*3,072
    = 113,639,424 MACs and the head 16*768*50,257; twice that for the batch."""
    report = report_of(run("hf:gpt2", "--layers", "1", "--batch", "2", "--seq", "16",
                           "--format", "json"))
    assert list(report.inputs[0].shape) == [2, 16]
    assert report.total.macs == 2 * (113_639_424 + 16 * 768 * 50_257)


@pytest.mark.parametrize("form", ["file", "dir"])
def test_a_local_config_json_or_its_folder(tmp_path, form):
    """A tiny Llama written by save_pretrained: 2 layers are capped to 1, 8 tokens (--seq)."""
    tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=100).save_pretrained(tmp_path)
    target = tmp_path / "config.json" if form == "file" else tmp_path
    model, args, _ = hf_model(str(target), META, None, layers=1, seq=8)
    assert type(model).__name__ == "LlamaForCausalLM" and len(model.model.layers) == 1
    assert tuple(args[0].shape) == (1, 8)


def test_a_name_missing_from_the_cache_exits_2_with_a_sentence():
    result = run("hf:no-such-org/no-such-model", "--view", "summary")
    assert result.returncode == 2, result.stderr
    assert "is not in the local Hugging Face cache" in result.stderr
    assert "never downloads" in result.stderr and "\n\n" not in result.stderr.strip()


def test_sizes_for_other_models_are_refused():
    result = run("gpt2", "--seq", "16")
    assert result.returncode == 2 and "--seq sizes a model built by hf:" in result.stderr


def test_a_failure_is_blamed_on_the_package_whose_code_raised_it():
    """The innermost frame decides: transformers' own ValueError for an unknown model type,
    chained under one of ours, is still transformers'."""
    from exportflops.hf.models import raised_by
    from exportflops.errors import BuildError

    try:
        try:
            tf.AutoConfig.for_model("no_such_type")
        except ValueError as error:
            raise BuildError("wrapped") from error
    except BuildError as wrapped:
        assert raised_by(wrapped).startswith("transformers (")
    with pytest.raises(UsageError) as ours:
        hf_model("clip_text_model", META, None, seq=78)
    assert raised_by(ours.value).startswith("exportflops (hf/modalities.py:")


def test_generate_keeps_the_cache_of_an_hf_model_on():
    # GPT-2, one layer, width 768, vocabulary 50257: a decode step at past 8 costs, per token,
    # 12 x 768^2 MACs (qkv 3, projection 1, MLP 8), attention 2 x 768 x (8 + 1) (q.k and p.v
    # over the 9 keys), and the head 768 x 50257.
    result = run("hf:gpt2", "--layers", "1", "--input", "1,8:int64", "--generate", "2",
                 "--format", "json")
    assert result.returncode == 0, result.stderr
    generation = GenerationReport.model_validate_json(result.stdout)
    assert generation.step(past=8).total.macs == 12 * 768**2 + 2 * 768 * 9 + 768 * 50257


@pytest.mark.parametrize("model_type, words", [
    # analyze_generation's own refusal of an image as the prompt
    ("vit", ("analyze_generation analyzes a model that generates tokens", "ViTModel",
             "Analyze its forward with analyze() instead")),
    ("sam_mask_decoder", ("--generate analyzes a model that generates tokens",
                          "image_embeddings", "without --generate")),
], ids=["vit", "sam_mask_decoder"])
def test_generate_on_a_model_that_takes_no_prompt_exits_2_saying_so(model_type, words, capfd):
    # ViT's first input is an image; SAM's mask decoder takes its inputs by name: neither
    # generates tokens from a prompt.
    from exportflops.cli import main

    assert main([f"hf:{model_type}", "--layers", "1", "--generate", "2"]) == 2
    error = capfd.readouterr().err
    assert all(word in error for word in words), error
