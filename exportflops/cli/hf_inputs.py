"""Example inputs for a Hugging Face model's forward, sized from its config: the model's main
input, the other modality of a multimodal model (pixels and text for CLIP), and the decoder's
tokens of an encoder-decoder. Zeros: valid token ids and images alike, and the counts depend on
shapes only."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import UsageError
from .hf_media import (MEL_BINS, accepted, boxes, config_int, encoder_states, feature_layouts,
                       fake_error, pixels, time_series, waveform)

#: Tokens per example sequence of a text model, unless --seq says otherwise (or the model's
#: positions are fewer: CLIP's text tower has 77).
HF_DEFAULT_SEQ_LEN = 128
#: Samples of a raw waveform (``input_values``): one second at 16 kHz, the sampling rate of
#: wav2vec2's, HuBERT's and WavLM's feature extractors.
HF_DEFAULT_SAMPLES = 16_000
#: Where a config keeps its longest sequence, by the names transformers' configs use.
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length",
                 "n_ctx", "max_text_len")
#: The inputs `example` makes.
KNOWN = ("input_ids", "decoder_input_ids", "token_type_ids", "attention_mask", "pixel_values",
         "pixel_values_videos", "input_features", "inputs_embeds", "query_embeds",
         "input_values")
#: The optional inputs made when forward's error under fake tensors names them (`_asked_for`).
SIDE_INPUTS = ("bbox", "encoder_hidden_states", "qformer_input_ids", "pixel_values")
#: The inputs of each modality, by the names transformers' forwards use.
MODALITIES = {"text": "input_ids", "vision": "pixel_values", "audio": "input_features"}


def hf_inputs(model, device, *, batch: int = 1, seq: int | None = None
              ) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` for ``model.forward``: its main input positional when it is forward's
    first parameter (so ``--dynamic seq`` finds it), the others by name. Every parameter that
    forward requires (no default) is made too, or refused with a UsageError that names it."""
    config = model.config
    signature = inspect.signature(model.forward).parameters
    parameters = list(signature)
    main = model.main_input_name
    if main not in parameters and _has_mel_bins(config):
        # An audio encoder whose forward calls its features hidden_states (Granite Speech's).
        main = "input_features"
    # A forward that lacks its main_input_name takes forward's first parameter: made by its own
    # name where it is one we know (BLIP-2's Q-Former: query_embeds), else as the main input
    # (Florence-2's vision backbone calls its pixels hidden_states).
    names = [main if main in parameters or parameters[0] not in KNOWN else parameters[0]]
    for modality, name in MODALITIES.items():
        # A composite model with a sub-config of this modality takes its input too.
        if name in parameters and name not in names and _has_sub_config(config, modality):
            names.append(name)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        names.append("decoder_input_ids")
    # The main input fills forward's first parameter where forward lacks its name.
    filled = names + ([parameters[0]] if names[0] not in parameters else [])
    names += [name for name, p in signature.items() if name not in filled
              and p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    inputs = {name: example(name, config, device, batch=batch, seq=seq) for name in names}
    first = names[0] == parameters[0] or names[0] not in parameters
    for name, candidates in inputs.items():
        if isinstance(candidates, list):  # layouts to choose from
            others = {k: v for k, v in inputs.items() if k != name}
            inputs[name] = accepted(model, name, candidates, others,
                                    first=first and name == names[0])
    args = (inputs.pop(names[0]),) if first else ()
    return args, _asked_for(model, args, inputs, device, batch=batch, seq=seq)


def _asked_for(model, args: tuple, inputs: dict[str, Any], device, *, batch: int,
               seq: int | None) -> dict[str, Any]:
    """``inputs`` and the optional inputs that forward's own error asks for under fake tensors
    ("You have to specify bbox": BROS; "encoder_hidden_states must be given": BLIP-2's
    Q-Former), among
    `SIDE_INPUTS`: forward's signature says these are optional, its code that they are not."""
    side = [name for name in inspect.signature(model.forward).parameters
            if name in SIDE_INPUTS and name not in inputs]
    for _ in side:
        error = fake_error(model, args, inputs)
        asked = [name for name in side if error is not None and name in str(error)
                 and name not in inputs]
        if not asked:
            break
        for name in asked:
            made = example(name, model.config, device, batch=batch, seq=seq)
            inputs[name] = made[0] if isinstance(made, list) else made
    return inputs


def _has_sub_config(config, modality: str) -> bool:
    # Set, not merely declared: embedding_gemma2 keeps vision_config = None.
    return any(getattr(config, f"{modality}_{part}", None) is not None
               for part in ("config", "configs"))


def _sub_config(config, modality: str):
    return getattr(config, f"{modality}_config", None) or config


def example(name: str, config, device, *, batch: int, seq: int | None):
    """The zero tensor for input ``name`` of a model with ``config``."""
    import torch

    if name in ("input_ids", "decoder_input_ids", "token_type_ids", "attention_mask"):
        decoder = name == "decoder_input_ids"
        # decoder=False would mean "not the decoder's" and return a composite config itself.
        text = config.get_text_config(decoder=True if decoder else None)
        return torch.zeros((batch, text_length(text, seq, decoder=decoder)), dtype=torch.long,
                           device=device)
    if name in ("pixel_values", "pixel_values_videos"):
        return pixels(name, _sub_config(config, "vision"), device, batch=batch)
    audio = _sub_config(config, "audio")
    if name == "input_features":  # a spectrogram: its layout is chosen by hf_inputs
        return feature_layouts(audio, device, batch=batch, seq=seq)
    if name in ("inputs_embeds", "query_embeds"):
        hidden = config.get_text_config().hidden_size
        return torch.zeros((batch, seq or HF_DEFAULT_SEQ_LEN, hidden), device=device)
    if name == "input_values":
        # A waveform, or a spectrogram where the config has mel bins (AST calls its own
        # input_values; SpeechT5's bins are its decoder's, its encoder reads a waveform).
        waves = waveform(audio, device, batch=batch, samples=seq or HF_DEFAULT_SAMPLES)
        if _has_mel_bins(audio):
            return waves + feature_layouts(audio, device, batch=batch, seq=seq)
        return waves
    if name in ("past_values", "past_values_padding", "freq"):
        return time_series(name, config, device, batch=batch, seq=seq)
    text = config.get_text_config()
    if name == "bbox":
        return boxes(config, device, batch=batch, length=text_length(text, seq))
    if name == "encoder_hidden_states":
        return encoder_states(config, device, batch=batch, length=text_length(text, seq))
    if name == "qformer_input_ids" and getattr(config, "qformer_config", None) is not None:
        length = text_length(config.qformer_config, seq)
        return torch.zeros((batch, length), dtype=torch.long, device=device)
    raise UsageError(f"exportflops does not know how to make an example {name!r} for "
                     f"{type(config).__name__}, and its forward requires it; pass the model's "
                     f"inputs with --input and --kwargs.")


def text_length(config, seq: int | None, *, decoder: bool = False) -> int:
    """``seq`` tokens, or HF_DEFAULT_SEQ_LEN bounded by the model's positions (its decoder's
    for decoder tokens); a ``seq`` longer than the positions is the user's error."""
    names = ("max_target_positions", *MAX_POSITIONS) if decoder else MAX_POSITIONS
    limit = next((getattr(config, n) for n in names
                  if isinstance(getattr(config, n, None), int)), None)
    if seq is None:
        return min(HF_DEFAULT_SEQ_LEN, limit or HF_DEFAULT_SEQ_LEN)
    if limit is not None and seq > limit:
        raise UsageError(f"--seq {seq}: {type(config).__name__} has {limit} positions "
                         f"({', '.join(names[:2])}); pass --seq {limit} or less.")
    return seq


def _has_mel_bins(config) -> bool:
    return config_int(config, MEL_BINS) is not None
