"""The inputs every model of a modality names alike, each a rule of the registry (`rules`, tier
`GENERAL`), asked after the family rules: token ids and their masks, images with their sizes and
patch grids, spectrograms and waveforms, embeddings, time series, boxes and encoder states.
Zeros: valid token ids and images alike, and the counts depend on shapes only."""

from __future__ import annotations

import math

import torch

from ..errors import UsageError
from .audio import codebook_layouts, features_config
from .media import (
    GRID_INPUTS, IMAGE_SIZES, MAX_POSITIONS, MEL_BINS, SIZE_INPUTS, boxes, config_int,
    encoder_states, feature_layouts, flattened_patches, grid, pixels, sizes, spectrogram,
    sub_config, time_series, waveform,
)
from .rules import GENERAL, HF_DEFAULT_SEQ_LEN, Wanted, input_rule
from .sizes import depth_positions

#: Samples of a raw waveform (``input_values``): one second at 16 kHz, the sampling rate of
#: wav2vec2's, HuBERT's and WavLM's feature extractors.
HF_DEFAULT_SAMPLES = 16_000
#: A text's token ids and the inputs of one value per token.
TOKENS = ("input_ids", "decoder_input_ids", "token_type_ids", "attention_mask")
#: The inputs that take a spectrogram, in the layouts `feature_layouts` makes.
SPECTROGRAMS = ("input_features", "audio_mel")
#: The inputs that take images, in the layouts `pixels` makes.
IMAGES = ("pixel_values", "pixel_values_videos")


@input_rule(*TOKENS, tier=GENERAL)
def tokens(wanted: Wanted):
    """``(batch, text_length)`` token ids (the decoder's text for ``decoder_input_ids``); for
    ids of several audio codebooks a step, layouts to choose from (`codebook_layouts`)."""
    decoder = wanted.name == "decoder_input_ids"
    # decoder=False would mean "not the decoder's" and return a composite config itself.
    text = wanted.config.get_text_config(decoder=True if decoder else None)
    ids = wanted.zeros((wanted.batch, text_length(text, wanted.seq, decoder=decoder)),
                       torch.long)
    layouts = codebook_layouts(ids, text) if wanted.name.endswith("input_ids") else None
    return layouts or ids


@input_rule(*IMAGE_SIZES, tier=GENERAL)
def image_sizes(wanted: Wanted):
    """Each image's (height, width) (`sizes`)."""
    return sizes(sub_config(wanted.config, "vision"), wanted.device, batch=wanted.batch)


@input_rule(*GRID_INPUTS, *SIZE_INPUTS, tier=GENERAL)
def image_grids(wanted: Wanted):
    """Each image's patch grid, or its target size (`grid`)."""
    return grid(wanted.name, sub_config(wanted.config, "vision"), wanted.device,
                batch=wanted.batch)


@input_rule(*IMAGES, tier=GENERAL)
def images(wanted: Wanted):
    """Images, or a video, of the vision config's size (`pixels`)."""
    return pixels(wanted.name, sub_config(wanted.config, "vision"), wanted.device,
                  batch=wanted.batch)


@input_rule("high_res_pixel_values", tier=GENERAL)
def high_res_images(wanted: Wanted):
    """DeepSeek-VL-Hybrid's second tower's images, of its 1024 pixels."""
    config = wanted.config
    vision = getattr(config, "high_res_vision_config", None) or sub_config(config, "vision")
    return pixels("pixel_values", vision, wanted.device, batch=wanted.batch)


@input_rule(*SPECTROGRAMS, tier=GENERAL)
def spectrograms(wanted: Wanted):
    """A spectrogram, its layout chosen by `inputs.hf_inputs`."""
    return feature_layouts(features_config(wanted.config), wanted.device, batch=wanted.batch,
                           seq=wanted.seq)


@input_rule("inputs_embeds", "query_embeds", "hidden_states", tier=GENERAL)
def embeddings(wanted: Wanted):
    """``steps`` vectors of the text config's hidden_size; hidden_states: a tower over
    another's states (FLAVA's multimodal encoder)."""
    hidden = wanted.config.get_text_config().hidden_size
    return wanted.zeros((wanted.batch, wanted.steps, hidden))


@input_rule("input_values", tier=GENERAL)
def waveforms(wanted: Wanted):
    """A waveform, or a spectrogram where the config has mel bins (AST calls its own
    input_values; SpeechT5's bins are its decoder's, its encoder reads a waveform). Whole
    tokens of samples_per_token samples (Muse Spark's 1,920: 80 ms at 24 kHz)."""
    audio, seq = sub_config(wanted.config, "audio"), wanted.seq
    per_token = config_int(audio, ("samples_per_token",)) or 1
    samples = seq or math.ceil(HF_DEFAULT_SAMPLES / per_token) * per_token
    waves = waveform(audio, wanted.device, batch=wanted.batch, samples=samples)
    if has_mel_bins(audio):
        return waves + feature_layouts(audio, wanted.device, batch=wanted.batch, seq=seq)
    return waves


@input_rule("flattened_patches", tier=GENERAL)
def patches_flattened(wanted: Wanted):
    """Pix2Struct's flattened patches (`flattened_patches`)."""
    return flattened_patches(sub_config(wanted.config, "vision"), wanted.device,
                             batch=wanted.batch, seq=wanted.seq)


@input_rule("spectrogram", tier=GENERAL)
def vocoder_spectrogram(wanted: Wanted):
    """A vocoder's spectrogram (`spectrogram`)."""
    return spectrogram(wanted.config, wanted.device, batch=wanted.batch, seq=wanted.seq)


@input_rule("past_values", "past_values_padding", "freq", tier=GENERAL)
def past_values(wanted: Wanted):
    """A time series' past values, their padding and frequency (`time_series`)."""
    return time_series(wanted.name, wanted.config, wanted.device, batch=wanted.batch,
                       seq=wanted.seq)


@input_rule("bbox", tier=GENERAL)
def token_boxes(wanted: Wanted):
    """A box per token of the text (`boxes`)."""
    length = text_length(wanted.config.get_text_config(), wanted.seq)
    return boxes(wanted.config, wanted.device, batch=wanted.batch, length=length)


@input_rule("encoder_hidden_states", tier=GENERAL)
def encoder_hidden_states(wanted: Wanted):
    """The states a decoder cross-attends to, as long as the text (`encoder_states`)."""
    length = text_length(wanted.config.get_text_config(), wanted.seq)
    return encoder_states(wanted.config, wanted.device, batch=wanted.batch, length=length)


@input_rule("qformer_input_ids", tier=GENERAL)
def qformer_tokens(wanted: Wanted):
    """The instruction tokens of a Q-Former (InstructBLIP's), where the config has one."""
    qformer = getattr(wanted.config, "qformer_config", None)
    if qformer is None:
        return None
    return wanted.zeros((wanted.batch, text_length(qformer, wanted.seq)), torch.long)


def text_length(config, seq: int | None, *, decoder: bool = False) -> int:
    """``seq`` tokens, or HF_DEFAULT_SEQ_LEN bounded by the model's positions (its decoder's
    for decoder tokens); a ``seq`` longer than the positions is the user's error."""
    names = ("max_target_positions", *MAX_POSITIONS) if decoder else MAX_POSITIONS
    field = next((n for n in names if isinstance(getattr(config, n, None), int)), None)
    limit = None if field is None else getattr(config, field)
    depth = depth_positions(config)
    if depth is not None and (limit is None or depth < limit):
        limit, field = depth, "num_codebooks"
    if seq is None:
        return min(HF_DEFAULT_SEQ_LEN, limit or HF_DEFAULT_SEQ_LEN)
    if limit is not None and seq > limit:
        raise UsageError(f"seq={seq}: {type(config).__name__} has {limit} positions "
                         f"({field}); pass seq={limit} or less.")
    return seq


def has_mel_bins(config) -> bool:
    return config_int(config, MEL_BINS) is not None
