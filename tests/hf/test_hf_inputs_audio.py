"""Inputs of the audio families (`exportflops.hf.audio`, `hf_inputs.example`), each
sized by the config field that the model's own code reads for it; each model then analyzes
with every op counted, or fails in transformers' own code, not for want of an input.

Sizes from transformers 5.23's default configs, at batch 1 and the default length
HF_DEFAULT_SEQ_LEN = 128 where the length is a free choice (tokens, frames):
MusicGen's and MusicGen Melody's decoders fold num_codebooks 4 into the batch (their forward
reshapes input_ids to (-1, num_codebooks, seq)); Dia's decoder reads a token of each of its
num_channels 9 codebooks a step, and cross-attends to states of cross_hidden_size 1024; Kyutai's
offsets pad one text token before num_codebooks 32 audio tokens a step; Inkling's audio embeds
n_mel_bins 80 quantized bins a frame (its num_codebooks); Qwen2.5-Omni's BigVGAN convolves
mel_dim 80 channels; VibeVoice's acoustic decoder upsamples latents of hidden_size 64; Fun-ASR's
encoder reads num_stacked_frames 7 frames of num_mel_bins 80 a row (7 x 80 = 560);
NeuCodec's and XCodec2's semantic model (a wav2vec2-BERT) reads feature_projection_input_dim
160 a frame, one frame per prod(downsampling_ratios (2, 2, 4, 4, 5)) = 320 samples of the mono
waveform of one second at 16 kHz that their acoustic encoder reads; Nemotron 3.5 Transcribe's
audio model reads its asr_config's num_mel_bins 128; Voxtral Realtime adds one audio embedding of
audio_length_per_tok 8 mel frames (of num_mel_bins 128) to each token; Mimi's and Pocket TTS's
encoders read ``(batch, channels, samples)`` (``_, channels, length = input_values.shape``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.inputs import HF_DEFAULT_SEQ_LEN
from exportflops.hf.modalities import HF_DEFAULT_SAMPLES
from tests.cli_support import named_inputs

pytest.importorskip("transformers")
META = torch.device("meta")
SEQ = HF_DEFAULT_SEQ_LEN

# model type -> {input name: shape} at one layer, batch 1, default length.
CASES = {
    "musicgen_decoder": {"input_ids": (1 * 4, SEQ)},
    "musicgen_melody_decoder": {"input_ids": (1 * 4, SEQ)},
    "dia_decoder": {"input_ids": (1, SEQ, 9), "encoder_hidden_states": (1, SEQ, 1024)},
    "kyutai_speech_to_text": {"input_ids": (1, SEQ, 1 + 32)},
    "inkling_audio": {"audio_input_ids": (1, SEQ, 80)},
    "qwen2_5_omni_bigvgan": {"mel_spectrogram": (1, 80, SEQ)},
    "vibevoice_acoustic_tokenizer_decoder": {"hidden_states": (1, 64, SEQ)},
    "fun_asr_nano_encoder": {"input_features": (1, SEQ, 7 * 80), "input_features_mask": (1, SEQ)},
    # One semantic frame per 2 x 2 x 4 x 4 x 5 = 320 samples: 16,000 / 320 = 50.
    "neucodec": {"input_values": (1, 1, HF_DEFAULT_SAMPLES), "input_features": (1, 50, 160)},
    "xcodec2": {"input_values": (1, 1, HF_DEFAULT_SAMPLES), "input_features": (1, 50, 160)},
    "nemo_speechlm": {"input_features": (1, SEQ, 128), "input_features_mask": (1, SEQ)},
    "voxtral_realtime": {"input_ids": (1, SEQ), "input_features": (1, 128, SEQ * 8)},
    "mimi_encoder": {"input_values": (1, 1, HF_DEFAULT_SAMPLES)},
    "pocket_tts_audio_tokenizer_encoder": {"input_values": (1, 1, HF_DEFAULT_SAMPLES)},
}
#: Those whose export then fails in transformers' own code, not for want of an input: Mimi's
#: and Pocket TTS's convolutions pad by an amount computed from tensors (their stride buffers),
#: which torch.export cannot read on meta (as EnCodec's, whose code theirs is copied from).
NOT_EXPORTED = {"mimi_encoder", "pocket_tts_audio_tokenizer_encoder"}


@functools.cache
def built(model_type: str, layers: int = 1):
    return hf_model(model_type, META, None, layers=layers)


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_audio_input_is_shaped_from_its_config(model_type):
    named = named_inputs(*built(model_type))
    shapes = {name: tuple(named[name].shape) for name in CASES[model_type] if name in named}
    assert shapes == CASES[model_type]


@pytest.mark.parametrize("model_type", [t for t in CASES if t not in NOT_EXPORTED])
def test_the_audio_model_then_analyzes_with_every_op_counted(model_type):
    report = analyze(*built(model_type))
    assert report.total.flops != 0
    assert not report.uncounted


def test_codebook_tokens_are_integers():
    # Token ids index an embedding whatever their layout.
    for model_type in ("musicgen_decoder", "dia_decoder", "kyutai_speech_to_text"):
        assert named_inputs(*built(model_type))["input_ids"].dtype == torch.long


def test_dias_decoder_tokens_carry_each_of_its_nine_codebooks():
    # DiaForConditionalGeneration: the decoder's 128 steps of num_channels 9 codebooks, in either
    # layout its forward takes (2-D ids it reshapes to (batch, 9, seq), or (batch, seq, 9));
    # the encoder's text alone.
    named = named_inputs(*built("dia"))
    assert tuple(named["decoder_input_ids"].shape) in {(1 * 9, SEQ), (1, SEQ, 9)}
    assert tuple(named["input_ids"].shape) == (1, SEQ)
    assert not analyze(*built("dia")).uncounted


def test_muse_sparks_waveform_is_whole_tokens_of_samples():
    # Its whole default config (--layers would cap num_hidden_layers, not its per-layer
    # hidden_sizes): patch_sizes (16, 6, 5, 4), 16 x 6 x 5 x 4 = 1,920 samples a token; one
    # second at 16 kHz, 16,000 samples, rounded up to whole tokens: ceil(16000 / 1920) = 9,
    # 9 x 1920 = 17,280.
    model, args, kwargs = built("muse_spark_audio", None)
    assert model.config.samples_per_token == 1920
    assert tuple(named_inputs(model, args, kwargs)["input_values"].shape) == (1, 9 * 1920)
    assert not analyze(model, args, kwargs).uncounted
