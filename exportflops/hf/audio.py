"""Inputs of the audio families, each sized by the config field that its model's own code reads
for it: tokens of several codebooks a step (MusicGen, Dia, Kyutai, Inkling), a vocoder's mel
spectrogram, a codec decoder's latents, Qwen2.5-Omni's speech DiT, the spectrogram that follows
from a model's tokens or waveform (Voxtral Realtime, XCodec2), a spectrogram of stacked frames
(Granite Speech 5), the frames of every example concatenated (the Qwen-Omni audio encoders).
The family inputs are rules of the registry (`rules`). None (or empty) where the config has no
such field, as in `tasks`."""

from __future__ import annotations

from .media import MEL_BINS, config_int, feature_layouts, mel_bins, sub_config
from .rules import Wanted, input_rule

#: The fields of a config of images, whose num_channels are colours, not codebooks (LayoutLMv3,
#: ViLT and UDOP have a vocab_size and num_channels 3).
IMAGE_FIELDS = ("image_size", "patch_size", "input_size")


#: Qwen2.5-Omni's speech DiT's inputs of a vector per mel frame (``codes * repeats`` frames),
#: and the config field of each one's width.
SPEECH_DIT_FRAMES = {"hidden_states": "mel_dim", "condition_vector": "mel_dim",
                     "reference_mel": "mel_dim", "speaker_embedding": "enc_emb_dim"}


@input_rule("quantized_code", "code", *SPEECH_DIT_FRAMES, "conditioning", "time_step")
def speech_dit(wanted: Wanted):
    """Qwen2.5-Omni's code-to-mel DiT (and Token2Wav around it, its dit_config): ``steps``
    speech codes, each repeats mel frames of mel_dim; a reference mel as long, which its
    speaker encoder reads; the speaker's embedding (enc_emb_dim) per frame, or once (Token2Wav's
    conditioning); the time of the flow per example. None where the DiT's config has no
    mel_dim, repeats and enc_emb_dim."""
    import torch

    dit, batch, codes = sub_config(wanted.config, "dit"), wanted.batch, wanted.steps
    fields = {field: config_int(dit, (field,)) for field in ("mel_dim", "repeats", "enc_emb_dim")}
    if None in fields.values():
        return None
    if wanted.name in ("quantized_code", "code"):
        return wanted.zeros((batch, codes), torch.long)
    if wanted.name == "conditioning":
        return wanted.zeros((batch, fields["enc_emb_dim"]))
    if wanted.name == "time_step":
        return wanted.zeros((batch,))
    frames = codes * fields["repeats"]
    return wanted.zeros((batch, frames, fields[SPEECH_DIT_FRAMES[wanted.name]]))


def codebook_layouts(ids, config) -> list | None:
    """Token ids ``(batch, seq)`` of a model that reads one token per codebook at each step, to
    choose from (`accepted`) where its config counts codebooks: as they are; the codebooks
    folded into the batch ``(batch * codebooks, seq)`` (MusicGen reshapes them to ``(-1,
    num_codebooks, seq)``); codebooks last ``(batch, seq, codebooks)``, which an embedding that
    adds each codebook's offset (``arange(codebooks) * vocab``) reads (Dia's decoder, Inkling's
    audio); and a text token before them ``(batch, seq, 1 + codebooks)`` (Kyutai pads its
    offsets with one for it). Which one a forward reads is in its code, not in its config.
    None where the config counts no codebooks: num_codebooks (Inkling's audio config maps it
    to its n_mel_bins), or num_channels in a text config of no images (Dia's decoder)."""
    codebooks = config_int(config, ("num_codebooks",))
    if (codebooks is None and config_int(config, ("vocab_size",)) is not None
            and config_int(config, IMAGE_FIELDS) is None):
        codebooks = config_int(config, ("num_channels",))
    if codebooks is None:
        return None
    batch, seq = ids.shape
    return [ids, ids.new_zeros((batch * codebooks, seq)), ids.new_zeros((batch, seq, codebooks)),
            ids.new_zeros((batch, seq, 1 + codebooks))]


@input_rule("audio_input_ids")
def codebook_tokens(wanted: Wanted):
    """Inkling's audio: a token per codebook (n_mel_bins) a frame, in the layouts of
    `codebook_layouts`."""
    import torch

    ids = wanted.zeros((wanted.batch, wanted.steps), torch.long)
    return codebook_layouts(ids, wanted.config)


@input_rule("mel_spectrogram")
def vocoder_mels(wanted: Wanted):
    """A vocoder whose first convolution reads mel_dim channels (Qwen2.5-Omni's BigVGAN):
    ``(batch, mel_dim, frames)``."""
    mels = config_int(wanted.config, ("mel_dim",))
    return None if mels is None else wanted.zeros((wanted.batch, mels, wanted.steps))


@input_rule("latents", "hidden_states")
def codec_latents(wanted: Wanted):
    """A codec's decoder: latent frames of hidden_size ``(batch, hidden_size, frames)``, which
    its upsampling convolution (Mimi's ``latents``, stride latent_stride) or its stem
    convolution before upsampling_ratios (VibeVoice's ``hidden_states``) reads."""
    config = wanted.config
    if (wanted.name == "latents" and config_int(config, ("latent_stride",)) is not None
            or wanted.name == "hidden_states" and getattr(config, "upsampling_ratios", None)):
        return wanted.zeros((wanted.batch, config.hidden_size, wanted.steps))
    return None


@input_rule("encoder_hidden_states")
def cross_states(wanted: Wanted):
    """Dia's decoder: its cross-attention projects its encoder's states of
    cross_hidden_size."""
    cross = config_int(wanted.config, ("cross_hidden_size",))
    return None if cross is None else wanted.zeros((wanted.batch, wanted.steps, cross))


def features_config(config):
    """The config whose fields size ``config``'s audio features: its audio sub-config (else
    itself); where that has no mel bins, the first of its sub-configs that has them (Nemotron
    3.5 Transcribe's audio model reads one spectrogram with its ASR encoder, asr_config's
    num_mel_bins 128, and its diarization model alike); else the config of the semantic model
    that reads them (NeuCodec's and XCodec2's wav2vec2-BERT, semantic_model_config)."""
    audio = sub_config(config, "audio")
    if config_int(audio, MEL_BINS) is not None:
        return audio
    for key in getattr(audio, "sub_configs", {}):
        part = getattr(audio, key, None)
        if part is not None and config_int(part, MEL_BINS) is not None:
            return part
    return getattr(config, "semantic_model_config", None) or audio


def audio_companions(config, inputs: dict) -> dict:
    """The spectrogram that follows from the other inputs of an audio family, in the layouts
    to choose from (`feature_layouts`): Voxtral Realtime adds one audio embedding to each token,
    audio_length_per_tok mel frames a token of input_ids; XCodec2 concatenates its semantic
    model's frames with its acoustic encoder's, one per prod(downsampling_ratios) samples of
    the waveform (NeuCodec trims both to the shorter). Empty for any other config."""
    import math

    per_token = config_int(config, ("audio_length_per_tok",))
    ratios = getattr(config, "downsampling_ratios", None)
    given = {name: value[0] if isinstance(value, list) else value
             for name, value in inputs.items()}
    if "input_features" not in given:
        return {}
    if per_token is not None and "input_ids" in given:
        source = given["input_ids"]  # (batch, tokens)
        frames = source.shape[1] * per_token
    elif ratios and hasattr(config, "semantic_model_config") and "input_values" in given:
        source = given["input_values"]  # (batch, [channels,] samples)
        frames = source.shape[-1] // math.prod(ratios)
    else:
        return {}
    return {"input_features": feature_layouts(features_config(config), source.device,
                                              batch=source.shape[0], seq=frames)}


def stacked_frames(model, layouts: list, config) -> list:
    """A last spectrogram layout to choose from: frames first, each of k stacked frames of the
    config's mel bins, where ``model``'s first linear layer reads k times the bins (Granite
    Speech 5's input_linear: num_mel_bins x 4, its feature extractor's stacking, in no config
    field). Empty where ``layouts`` have no frames-first spectrogram or that layer reads
    another width."""
    import torch

    bins = mel_bins(features_config(config))
    frames_first = next((t for t in layouts if isinstance(t, torch.Tensor) and t.dim() == 3
                         and t.shape[-1] == bins and t.is_floating_point()), None)
    first = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
    width = first.in_features if first is not None else bins
    if frames_first is None or width % bins or width == bins:
        return []
    return [frames_first.new_zeros(frames_first.shape[:-1] + (width,))]


def concatenated_frames(layouts: list, config) -> list:
    """A spectrogram layout to choose from: the frames of every example concatenated, bins
    first, with no batch axis ``(bins, batch x frames)``, as the Qwen2.5-Omni and Qwen3-Omni
    audio encoders take them beside each example's length (``feature_lens``; their thinkers
    gather the frames by the mask before the tower). Empty where ``layouts`` have no bins-first
    spectrogram."""
    import torch

    bins = mel_bins(features_config(config))
    bins_first = next((t for t in layouts if isinstance(t, torch.Tensor) and t.dim() == 3
                       and t.shape[1] == bins and t.is_floating_point()), None)
    if bins_first is None:
        return []
    batch, _, frames = bins_first.shape
    return [bins_first.new_zeros((bins, batch * frames))]
