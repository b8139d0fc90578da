"""Example inputs of Hugging Face forwards beyond tokens: images and videos, audio features,
time series, and the side inputs some forwards require (boxes, encoder states), each shaped
from the config's own fields. Zeros, as in `hf_inputs`: the counts depend on shapes only."""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import UsageError
from .needs import fake_error, innermost, needed_input
from .sizes import config_int, vq_image_size, windowed_side

#: Where a config keeps its longest sequence, by the names transformers' configs use.
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length",
                 "n_ctx", "max_text_len")
#: Where a config keeps the mel bins of its audio features (wav2vec2-BERT and SeamlessM4T
#: stack two frames of 80 bins: feature_projection_input_dim 160; Phi-4-multimodal's audio
#: encoder normalizes and convolves input_size 80).
MEL_BINS = ("feature_projection_input_dim", "num_mel_bins", "feature_size",
            "input_feat_per_channel", "n_mels", "input_dim", "input_feat_size", "input_size")
#: Where a config keeps the frames of a video clip (VideoMAE 16, ViViT 32, TimeSformer 8,
#: V-JEPA 2 64).
VIDEO_FRAMES = ("num_frames", "frames_per_clip")
#: Frames of a spectrogram when the config bounds none: whisper's 30 s are 3,000.
HF_DEFAULT_FRAMES = 128


def sub_config(config, modality: str):
    """``config``'s sub-config of ``modality`` (``vision_config``), or ``config`` itself where
    it has none (a vision model's own config)."""
    return getattr(config, f"{modality}_config", None) or config


def image_size(config) -> tuple[int, int]:
    """The (height, width) of ``config``'s images: the patch over the smallest of the scaled
    images' ratios where the config scales its images (DepthPro), else image_size, else
    crop_size (V-JEPA 2), else the frames a visual prompt pads (TVP's max_img_size), else its
    backbone's image_size (ViTPose's 256 x 192), else a VQ-GAN's latent grid scaled up
    (`hf_sizes.vq_image_size`), else 224; each side rounded to whole windows (`windowed_side`)."""
    backbone = getattr(config, "backbone_config", None)
    ratios = getattr(config, "scaled_images_ratios", None)
    if ratios and isinstance(getattr(config, "patch_size", None), int):
        # DepthPro cuts its smallest scaling of the image into patches: 384 / 0.25 = 1536.
        side = math.ceil(config.patch_size / min(ratios))
        return side, side
    size = (getattr(config, "image_size", None) or getattr(config, "crop_size", None)
            or getattr(config, "max_img_size", None) or getattr(backbone, "image_size", None)
            or vq_image_size(config) or 224)
    if isinstance(size, dict):  # {"height": h, "width": w}
        size = size["height"], size["width"]
    height, width = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
    return windowed_side(height, config), windowed_side(width, config)


def pixels(name: str, vision, device, *, batch: int):
    """Images ``(batch, channels, height, width)``; a video ``(batch, frames, channels, height,
    width)`` for ``pixel_values_videos``; to choose from (`accepted`) for ``pixel_values``: a
    video and its frames as a batch of images (X-CLIP's vision tower) where the vision config
    counts frames, one image of ``max_num_tiles`` tiles where it tiles them (Mllama), else
    images, a list of one image per example (Idefics2, SmolVLM), and a
    pair of images per example (SuperGlue)."""
    import torch

    height, width = image_size(vision)
    channels = getattr(vision, "num_channels", 3)
    frames = config_int(vision, VIDEO_FRAMES)
    if name == "pixel_values_videos":
        return torch.zeros((batch, frames or 16, channels, height, width), device=device)
    if frames is not None:
        return [torch.zeros((batch, frames, channels, height, width), device=device),
                torch.zeros((batch * frames, channels, height, width), device=device)]
    tiles = config_int(vision, ("max_num_tiles",))
    if tiles is not None:  # Mllama: each image cut into up to max_num_tiles tiles
        return [torch.zeros((batch, 1, tiles, channels, height, width), device=device)]
    # Images; one per example in a list (Idefics2); a pair per example (the keypoint matchers,
    # SuperGlue, LightGlue, EfficientLoFTR, match two images).
    return [torch.zeros((batch, channels, height, width), device=device),
            torch.zeros((batch, 1, channels, height, width), device=device),
            torch.zeros((batch, 2, channels, height, width), device=device)]


def waveform(config, device, *, batch: int, samples: int) -> list:
    """A raw waveform, to choose from (`accepted`): ``(batch, samples)`` (wav2vec2, HuBERT) or
    ``(batch, audio_channels, samples)`` (the codecs: EnCodec, Mimi, DAC; mono unless the
    config says)."""
    import torch

    channels = config_int(config, ("audio_channels", "channels")) or 1
    return [torch.zeros((batch, samples), device=device),
            torch.zeros((batch, channels, samples), device=device)]


def spectrogram_frames(audio, seq: int | None, *, bins_first: bool) -> int:
    """Frames of a spectrogram: ``seq``; else, for whisper's layout, twice max_source_positions
    (its feature extractor pads 30 s to 3,000 frames and its convolution strides by 2); else the
    config's max_length (AST's 1,024); else HF_DEFAULT_FRAMES, a length that frames-first
    encoders (Conformers, Speech2Text) take as any other; each rounded up to whole
    windows of 2 x ``n_window`` frames where the config has those."""
    positions = config_int(audio, ("max_source_positions",))
    if seq:
        return seq
    if bins_first and positions is not None:
        frames = 2 * positions
    else:
        frames = config_int(audio, ("max_length",)) or HF_DEFAULT_FRAMES
    # Encoders that cut the features into windows of 2 x n_window frames (Qwen3-ASR's 100)
    # take whole windows only.
    window = 2 * (config_int(audio, ("n_window",)) or 1)
    return math.ceil(frames / window) * window


def mel_bins(audio) -> int:
    """The features of one spectrogram row: the config's mel bins (80 where it names none),
    times the frames stacked in a row (Fun-ASR's num_stacked_frames: 7 x 80)."""
    return (config_int(audio, MEL_BINS) or 80) * (config_int(audio, ("num_stacked_frames",)) or 1)


def feature_layouts(audio, device, *, batch: int, seq: int | None) -> list:
    """The layouts a spectrogram comes in, to choose from (`accepted`): bins as channels
    (whisper's convolutions), frames first (Speech2Text, Parakeet, wav2vec2-BERT, AST), and
    an image of ``patch_embed_input_channels`` (CLAP's Swin) where the config has those. Where
    a forward takes two (AST's patches are as many either way), the first wins: whisper's
    layout where the config bounds the positions of a fixed window (max_source_positions),
    else frames first."""
    import torch

    bins = mel_bins(audio)
    frames = spectrogram_frames(audio, seq, bins_first=False)
    layouts = [(batch, bins, spectrogram_frames(audio, seq, bins_first=True)),
               (batch, frames, bins)]
    if config_int(audio, ("max_source_positions",)) is None:
        layouts.reverse()
    if isinstance(getattr(audio, "patch_embed_input_channels", None), int):
        layouts.insert(0, (batch, audio.patch_embed_input_channels, frames, bins))
    return [torch.zeros(shape, device=device) for shape in layouts]


def accepted(model, name: str, candidates: list, others: dict[str, Any], *, first: bool,
             masks=lambda candidate: {}):
    """The first of ``candidates`` for input ``name`` (forward's first parameter, if
    ``first``) that ``model``'s forward runs with under fake tensors; else the first that
    fails only for want of an optional input forward reads while None (`needed_input`: made
    after, by `hf_inputs._asked_for`; Qwen3-ASR's input_features_mask, read once the frames
    passed its window check); else the first whose number of dimensions forward unpacks
    (`rank_refused`), so that the error told is the one past it (SmolVLM's default config,
    whose pixel shuffle does not divide its patch grid, fails so on its images of one per
    example); else the first. Which layout a forward wants is written in its code, not in its
    config or signature. ``masks`` gives the inputs that follow a candidate's layout (its
    mask)."""
    import inspect

    wanting, unpacked = None, None
    for candidate in candidates:
        others_ = others | masks(candidate)
        args, kwargs = ((candidate,), others_) if first else ((), others_ | {name: candidate})
        error = fake_error(model, args, kwargs)
        if error is None:
            return candidate
        missing = [p for p in inspect.signature(model.forward).parameters
                   if p not in kwargs and p != name]
        if wanting is None and needed_input(error, missing) is not None:
            wanting = candidate
        if unpacked is None and not rank_refused(error, candidate.dim()):
            unpacked = candidate
    return next((c for c in (wanting, unpacked) if c is not None), candidates[0])


def rank_refused(error: BaseException, rank: int) -> bool:
    """Whether ``error`` is Python's, unpacking a shape of ``rank`` dimensions where forward
    wants another number (``batch, images, channels, height, width = pixel_values.shape``):
    the number it got, where Python says it, is ``rank``, not that of a tuple deeper in."""
    cause = innermost(error)
    got = re.search(r"got (\d+)\)", str(cause))
    return (isinstance(cause, ValueError) and "values to unpack" in str(cause)
            and (got is None or int(got.group(1)) == rank))


def time_series(name: str, config, device, *, batch: int, seq: int | None):
    """A time series' past ``(batch, seq or context_length[, num_input_channels])``: PatchTST
    and PatchTSMixer take channels, TimesFM one series per row; its padding alike; TimesFM's
    frequency class per row."""
    import torch

    length = seq or config_int(config, ("context_length",)) or HF_DEFAULT_FRAMES
    channels = config_int(config, ("num_input_channels",))
    shape = (batch, length) if channels is None else (batch, length, channels)
    if name == "freq":
        return torch.zeros((batch, 1), dtype=torch.long, device=device)
    return torch.zeros(shape, device=device)


def boxes(config, device, *, batch: int, length: int) -> list:
    """One box per token ``(batch, length, 4)``, to choose from (`accepted`): integer
    coordinates first where the config embeds them (LayoutLM's max_2d_position_embeddings),
    else floats first (BROS projects them; UDOP, which also embeds them, averages them too)."""
    import torch

    dtypes = [torch.long, torch.float]
    if not hasattr(config, "max_2d_position_embeddings"):
        dtypes.reverse()
    return [torch.zeros((batch, length, 4), dtype=dtype, device=device) for dtype in dtypes]


def encoder_states(config, device, *, batch: int, length: int):
    """The states a cross-attention reads ``(batch, length, encoder_hidden_size)`` (BLIP-2's
    Q-Former reads its vision tower's)."""
    import torch

    width = config_int(config, ("encoder_hidden_size", "hidden_size"))
    return torch.zeros((batch, length, width), device=device)


#: The forward parameters that take one patch grid ``(t, h, w)`` per image, with the image as
#: flattened patches: Qwen2-VL's vision tower (``grid_thw``) and the models around it
#: (``image_grid_thw``); ``(h, w)`` without time (Nemotron-H Omni's ``image_grid_hw``).
GRID_INPUTS = ("grid_thw", "image_grid_thw", "image_grid_hw")
#: Where forward takes each image's merge of patches into tokens, a side (VideoLLaMA 3's).
MERGE_SIZES = ("image_merge_sizes", "merge_sizes")
#: The forward parameters that take the ``(h, w)`` patches of each image given whole
#: (MiniCPM-V's vision tower: ``target_sizes``).
SIZE_INPUTS = ("target_sizes",)
#: The forward parameters that take the ``(h, w)`` pixels of each image (LLaVA-NeXT).
IMAGE_SIZES = ("image_sizes",)
#: Where a config keeps the token that stands for one image token in ``input_ids``.
IMAGE_TOKEN = ("image_token_id", "image_token_index")
#: Where a config counts the tokens one image becomes (Kosmos-2's latent queries).
IMAGE_TOKENS = ("latent_query_num", "image_seq_length", "num_image_tokens")
#: The masks a forward reads over another input, and that input: audio frames, image pixels
#: (Phi-4-multimodal's audio encoder calls its mask of frames ``mask``); and the lengths of each
#: example's audio that a forward masks its frames by (Dots3-Note's, in waveform samples).
MASKS = {"feature_attention_mask": "input_features", "input_features_mask": "input_features",
         "pixel_attention_mask": "pixel_values", "image_embeds_position_mask": "input_ids",
         "audio_mel_mask": "audio_mel", "mask": "input_features",
         "chunk_sample_lengths": "input_features", "feature_lens": "input_features"}


def merge_size(vision) -> int:
    """Patches a side that the merger joins into one token: spatial_merge_size (Qwen2-VL's 2),
    else the first of merge_kernel_size (Kimi-K2.5's (2, 2)), else 1."""
    kernel = getattr(vision, "merge_kernel_size", None)
    return (config_int(vision, ("spatial_merge_size",))
            or (kernel[0] if isinstance(kernel, (list, tuple)) else None) or 1)


def patch_grid(vision) -> tuple[int, int, int]:
    """``(t, h, w)``: the patch grid of one still image as Qwen2-VL's processor makes it. One
    step in time (the processor repeats a still image temporal_patch_size times to fill it), and
    image_size / patch_size patches a side, rounded down to a multiple of `merge_size` (the
    merger joins merge x merge patches into one token)."""
    height, width = image_size(vision)
    patch = config_int(vision, ("patch_size",)) or 14
    merge = merge_size(vision)
    return 1, height // patch // merge * merge, width // patch // merge * merge


def naflex(vision, device, *, batch: int) -> dict | None:
    """SigLIP 2's NaFlex images, as its processor makes them: each image resized to a grid of
    at most num_patches patches (a square image: isqrt(num_patches) a side; 16 x 16 of 256),
    its patches flattened ``(batch, patches, channels * patch_size ** 2)``, a mask over them,
    and the grid per image (``spatial_shapes``). None where the config has no num_patches."""
    import torch

    count = config_int(vision, ("num_patches",))
    if count is None:
        return None
    side = math.isqrt(count)
    patch = config_int(vision, ("patch_size",)) or 16
    channels = config_int(vision, ("num_channels",)) or 3
    return {"pixel_values": torch.zeros((batch, side * side, channels * patch * patch),
                                        device=device),
            "pixel_attention_mask": torch.ones((batch, side * side), dtype=torch.long,
                                               device=device),
            "spatial_shapes": torch.full((batch, 2), side, dtype=torch.long, device=device)}


def patches(vision, device, *, batch: int):
    """One image per example as Qwen2-VL's processor flattens it: every patch a row
    ``(batch * t * h * w, channels * temporal_patch_size * patch_size ** 2)``."""
    import torch

    t, h, w = patch_grid(vision)
    channels = config_int(vision, ("in_channels", "num_channels")) or 3
    patch = config_int(vision, ("patch_size",)) or 14
    depth = config_int(vision, ("temporal_patch_size",)) or 1
    return torch.zeros((batch * t * h * w, channels * depth * patch * patch), device=device)


def grid(name: str, vision, device, *, batch: int):
    """The `patch_grid` of each example's image ``(batch, 3)``; ``(batch, 2)``, rows and
    columns, for the inputs named so (``image_grid_hw``, `SIZE_INPUTS`)."""
    import torch

    t, h, w = patch_grid(vision)
    rows = [t, h, w] if name.endswith("thw") else [h, w]
    return torch.tensor([rows] * batch, dtype=torch.long, device=device)


def sizes(vision, device, *, batch: int):
    """Each example's image ``(batch, 2)``: its `image_size` in pixels, rows then columns."""
    import torch

    return torch.tensor([list(image_size(vision))] * batch, dtype=torch.long, device=device)


def image_tokens(vision) -> int:
    """Tokens one image becomes: its patches over merge x merge."""
    t, h, w = patch_grid(vision)
    return t * h * w // merge_size(vision) ** 2


def with_image_tokens(ids, token: int, count: int):
    """``ids`` with the first ``count`` tokens of each example set to ``token`` (the image's
    placeholders, which the model replaces with the image's features)."""
    ids = ids.clone()
    ids[:, :count] = token
    return ids


def mask(name: str, masked, config, audio, *, batch: int):
    """Ones over what ``masked`` (the input `MASKS` names) holds: its image tokens (as many as
    `IMAGE_TOKENS` of ``config`` says, else all), its frames for an audio mask (the axis that
    is not `mel_bins`), its pixels for an image mask (the channel axis, third from last,
    dropped); for audio lengths, each example's frames (``feature_lens``; ``batch`` equal
    lengths where the frames of the examples come concatenated, bins first, with no batch
    axis: `hf_audio_inputs.concatenated_frames`), or in
    samples, its frames times the config's hop_length (None where it has none, and for any
    other mask of concatenated frames)."""
    import torch

    if MASKS[name] == "input_ids":  # one per image token, where the config counts them
        count = config_int(config, IMAGE_TOKENS)
        ones = torch.ones_like(masked)
        return ones if count is None else with_image_tokens(torch.zeros_like(masked), 1, count)
    if MASKS[name] == "pixel_values":
        shape = masked.shape[:-3] + masked.shape[-2:]
        return torch.ones(shape, dtype=torch.bool, device=masked.device)
    if masked.dim() == 2 and masked.shape[0] == mel_bins(audio):
        # The examples' frames concatenated (the Qwen-Omni audio encoders): their lengths.
        if name != "feature_lens":
            return None
        if masked.shape[1] % batch:
            raise UsageError(f"batch={batch}: the {masked.shape[1]} frames of the examples "
                             f"concatenated do not split evenly; pass feature_lens with "
                             f"kwargs=, or frames a multiple of {batch}.")
        return torch.full((batch,), masked.shape[1] // batch, dtype=torch.long,
                          device=masked.device)
    frames = masked.shape[-1] if masked.shape[1] == mel_bins(audio) else masked.shape[1]
    if name == "feature_lens":  # each example's frames (Qwen2.5-Omni's audio encoder)
        return torch.full((masked.shape[0],), frames, dtype=torch.long, device=masked.device)
    if name == "chunk_sample_lengths":
        # Not zeros: Dots3-Note masks the frames past length / hop_length of each example, and
        # its adapter reads the frames left. All of them: the samples of every frame.
        hop = config_int(audio, ("hop_length",))
        return None if hop is None else torch.full((masked.shape[0],), frames * hop,
                                                   dtype=torch.long, device=masked.device)
    return torch.ones((masked.shape[0], frames), dtype=torch.long, device=masked.device)


def flattened_patches(vision, device, *, batch: int, seq: int | None):
    """Pix2Struct's image: ``seq`` (else the config's seq_len) patches, each its row and column
    and then its patch_embed_hidden_size pixels ``(batch, patches, 2 + pixels)``."""
    import torch

    count = seq or config_int(vision, ("seq_len",)) or 2048
    width = 2 + (config_int(vision, ("patch_embed_hidden_size",)) or 16 * 16 * 3)
    return torch.zeros((batch, count, width), device=device)


def spectrogram(config, device, *, batch: int, seq: int | None):
    """A vocoder's mel spectrogram (HiFi-GAN's) ``(batch, frames, model_in_dim)``: ``seq`` or
    HF_DEFAULT_FRAMES frames."""
    import torch

    bins = config_int(config, ("model_in_dim",)) or mel_bins(config)
    return torch.zeros((batch, seq or HF_DEFAULT_FRAMES, bins), device=device)
