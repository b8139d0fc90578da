"""Example inputs for a Hugging Face model's forward, sized from its config: the model's main
input, the other modality of a multimodal model (pixels and text for CLIP), and the decoder's
tokens of an encoder-decoder. Zeros: valid token ids and images alike, and the counts depend on
shapes only."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import UsageError
# The rule modules first, in the order a name's rules are asked (`rules`): the families'
# (tasks, audio, images), then the general ones (modalities, imported below).
from . import tasks as _tasks, audio as _audio, images as _images  # noqa: F401
from .audio import concatenated_frames, features_config, stacked_frames
from .companions import companions
from .images import image_placeholders, patch_layouts, patch_rows, pooled_crops, token_blocks
from .media import (
    GRID_INPUTS, MASKS, MERGE_SIZES, accepted, fake_error, grid, image_tokens, mask, naflex,
    patches, sub_config,
)
from .modalities import IMAGES, SPECTROGRAMS, has_mel_bins
from .needs import needed_input, refused_ids
from .rules import FAMILY, HF_DEFAULT_SEQ_LEN, UnknownInputError, Wanted, make

#: The inputs `example` makes.
KNOWN = ("input_ids", "decoder_input_ids", "token_type_ids", "attention_mask", "pixel_values",
         "pixel_values_videos", "input_features", "inputs_embeds", "query_embeds",
         "input_values", "flattened_patches")
#: The optional inputs made when forward's error under fake tensors names them (`_asked_for`).
SIDE_INPUTS = ("bbox", "encoder_hidden_states", "qformer_input_ids", "pixel_values",
               "high_res_pixel_values", "visual_feats", "visual_pos")
#: Combinations of layouts tried at most, where several inputs come in layouts to choose from.
MAX_TOGETHER = 16
#: The inputs of each modality, by the names transformers' forwards use.
MODALITIES = {"text": "input_ids", "vision": "pixel_values", "audio": "input_features"}


def hf_inputs(model, device, *, batch: int = 1, seq: int | None = None, config=None
              ) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` for ``model.forward``: its main input positional when it is forward's
    first parameter (where the command's ``--dynamic seq`` finds it), the others by name. Every
    parameter that forward requires (no default) is made too, or refused with a UsageError that
    names it.
    ``config`` is the model's own unless given (a module of a sub-model config keeps none)."""
    config = config if config is not None else model.config
    signature = inspect.signature(model.forward).parameters
    parameters = list(signature)
    main = getattr(model, "main_input_name", parameters[0])
    encoder_main = getattr(getattr(model, "encoder", None), "main_input_name", None)
    if main == "inputs" and encoder_main in KNOWN:
        # A generic name for the encoder's own input (SpeechEncoderDecoder's waveform).
        main = encoder_main
    if main not in parameters and has_mel_bins(config):
        # An audio encoder whose forward calls its features hidden_states (Granite Speech's).
        main = "input_features"
    if (main not in parameters and parameters[0] not in KNOWN
            and make(Wanted(parameters[0], config, "meta", 1, 1), (FAMILY,)) is not None):
        # A first parameter that a family's rule makes (Qwen2.5-Omni's DiT reads mel frames
        # that it calls hidden_states).
        main = parameters[0]
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
    if "lang_ids" in parameters and getattr(config, "default_language", "") is None:
        # X-MOD's language adapters: the language of each example, where no default is set.
        names.append("lang_ids")
    # The main input fills forward's first parameter where forward lacks its name.
    filled = names + ([parameters[0]] if names[0] not in parameters else [])
    names += [name for name, p in signature.items() if name not in filled
              and p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    # A required mask (Qwen3-ASR's input_features_mask) follows the input it masks, made last.
    masks = [name for name in names if name in MASKS]
    # SigLIP 2's images: patches with their mask and grid, made together, and also where its
    # composite's forward takes them as optional (raw pixels fail in its patch embedding).
    images = (naflex(sub_config(config, "vision"), device, batch=batch)
              if "spatial_shapes" in signature and "pixel_values" in names else None) or {}
    together = {name: value for name, value in images.items() if name in signature}
    inputs = {name: example(name, config, device, batch=batch, seq=seq) for name in names
              if name not in masks and name not in together}
    inputs |= companions(set(signature), config, inputs, steps=seq or HF_DEFAULT_SEQ_LEN)
    inputs |= together
    crops = ("image_token_pooling" in signature and "pixel_values" in inputs
             and pooled_crops(sub_config(config, "vision"), device, batch=batch))
    if crops:  # Molmo2's: crops of patch rows, pooled into tokens by index
        made, tokens = crops
        inputs |= {name: value for name, value in made.items() if name in signature}
        image_placeholders(inputs, set(signature), config, tokens, seq)
    grid_input = next((name for name in GRID_INPUTS if name in signature), None)
    # The patches: pixel_values, or forward's first parameter where it has no name we know
    # (Qwen2-VL's vision tower calls them hidden_states).
    pixel_name = "pixel_values" if "pixel_values" in inputs else names[0]
    first = names[0] == parameters[0] or names[0] not in parameters
    positional = names[0] if first else None
    if grid_input is not None and (pixel_name in inputs and pixel_name not in parameters
                                   or pixel_name == "pixel_values"):
        # Patches where the grid is required, or where whole images fail (RADIO takes either).
        if (signature[grid_input].default is inspect.Parameter.empty
                or _fails(model, inputs, positional)):
            _patch_inputs(inputs, pixel_name, grid_input, set(signature), config, device,
                          batch=batch, seq=seq)
            # A grid counted in merged tokens, each a block of patches (Inkling 2's), where
            # the patch grid fails.
            blocks = token_blocks(sub_config(config, "vision"), device, batch=batch)
            blocks = dict(zip((pixel_name, grid_input), blocks or ()))
            if (blocks and _fails(model, inputs, positional)
                    and not _fails(model, inputs | blocks, positional)):
                inputs |= blocks
    layouts = {name: value for name, value in inputs.items() if isinstance(value, list)}
    for name, candidates in inputs.items():
        if isinstance(candidates, list):  # layouts to choose from, each with its masks

            def masked(candidate, name=name) -> dict[str, Any]:
                return {m: _typed(model, m, _side_input(m, config, {name: candidate}, device,
                                                        batch=batch, seq=seq))
                        for m in masks if MASKS[m] == name}

            # The first layout of another input still to choose (Dia's encoder's tokens).
            others = {k: v[0] if isinstance(v, list) else v for k, v in inputs.items()
                      if k != name}
            if name in SPECTROGRAMS:
                candidates = candidates + stacked_frames(model, candidates, config)
                if "feature_lens" in signature:  # lengths of the examples concatenated
                    candidates = concatenated_frames(candidates, config) + candidates
            if name in IMAGES:  # last, rows of patches for a linear patch embedding (Molmo2's)
                candidates = candidates + patch_rows(model, sub_config(config, "vision"), device,
                                                     batch=batch)
            inputs[name] = accepted(model, name, candidates, others,
                                    first=first and name == names[0], masks=masked)

    ours = [m for m in masks if m not in inputs]  # the masks made here, over what they mask

    def made_masks(given: dict[str, Any]) -> dict[str, Any]:
        return {m: _typed(model, m, _side_input(m, config, given, device, batch=batch, seq=seq))
                for m in ours}

    inputs |= made_masks(inputs)
    if len(layouts) > 1 and _fails(model, inputs, positional):
        inputs |= _together(model, layouts, inputs, positional, made_masks)
    args = (inputs.pop(names[0]),) if first else ()
    return _asked_for(model, config, args, inputs, device, batch=batch, seq=seq)


def _typed(model, name: str, value):
    """``value`` as booleans where forward annotates ``name`` a ``torch.BoolTensor`` (Gemma 3n's
    audio_mel_mask, which torch.where takes as its predicate)."""
    import torch

    parameter = inspect.signature(model.forward).parameters.get(name)
    kind = getattr(parameter, "annotation", None)
    if isinstance(value, torch.Tensor) and (kind is torch.BoolTensor or kind == "torch.BoolTensor"):
        return value.bool()
    return value


def _together(model, layouts: dict[str, list], inputs: dict[str, Any], positional: str | None,
              masks) -> dict[str, Any]:
    """The first combination of the inputs' ``layouts`` (in their order) that forward runs
    with, where those chosen one input at a time, each beside the others' first, fail together:
    NeuCodec's waveform and its semantic model's features run only in their second layouts
    each. ``masks`` gives the masks that follow a combination. Empty where none runs (the
    export then names the failure); at most `MAX_TOGETHER` tries."""
    import itertools

    for combination in itertools.islice(itertools.product(*layouts.values()), MAX_TOGETHER):
        trial = inputs | dict(zip(layouts, combination))
        trial |= masks(trial)
        if not _fails(model, trial, positional):
            return trial
    return {}


def _fails(model, inputs: dict[str, Any], positional: str | None) -> bool:
    """Whether forward fails under fake tensors with ``inputs`` (the first of each layout to
    choose from), ``positional`` passed first."""
    chosen = {k: v[0] if isinstance(v, list) else v for k, v in inputs.items()}
    args = (chosen.pop(positional),) if positional is not None else ()
    return fake_error(model, args, chosen) is not None


def _asked_for(model, config, args: tuple, inputs: dict[str, Any], device, *, batch: int,
               seq: int | None) -> tuple[tuple, dict[str, Any]]:
    """``(args, inputs)`` with the optional inputs that forward's own error asks for under fake
    tensors, and embeddings in place of ids where its own check refuses ids (`refused_ids`):
    by name among `SIDE_INPUTS` ("You have to specify bbox": BROS; "encoder_hidden_states must
    be given": BLIP-2's Q-Former), or by reading it while None (`needed_input`: LongT5's
    attention_mask, Qwen2-Audio's feature_attention_mask). Forward's signature says these are
    optional, its code that they are not. One that forward reads and we cannot make is an
    `UnknownInputError` (its composite may hold it: `hf_parent`); one only named in an error
    is left out, for the export's error to name it."""
    signature = inspect.signature(model.forward).parameters
    parameters = list(signature)
    given = set(parameters[:len(args)]) | set(inputs)
    side = [name for name in parameters if name in SIDE_INPUTS and name not in given]
    optional = {name for name in parameters if signature[name].default is None} - given
    # At most one try per input it could add, and one for embeddings in place of ids.
    for _ in range(len(side) + len(MASKS) + 2):
        # Past a branch on values a real forward runs (seconds), where an input may be read.
        error = fake_error(model, args, inputs, past_values=bool(optional - set(inputs)))
        if error is None:
            break
        if refused_ids(error, parameters, args, inputs):
            # Qwen3-Omni's code predictor reads only embeddings (its talker sums several
            # codebooks' into them) and raises on ids.
            args, inputs = (), {k: v for k, v in inputs.items() if k != "input_ids"}
            inputs["inputs_embeds"] = example("inputs_embeds", config, device, batch=batch,
                                              seq=seq)
            continue
        asked = [name for name in side if name in str(error).lower() and name not in inputs]
        needed = needed_input(error, [p for p in parameters if p not in given | set(inputs)])
        if needed is not None and needed not in asked:
            asked.append(needed)
        made = {}
        for name in asked:
            try:
                made[name] = _side_input(name, config, dict(zip(parameters, args)) | inputs,
                                         device, batch=batch, seq=seq)
            except UnknownInputError:
                if name == needed:  # forward reads it: a composite that holds this may tell
                    raise
            except UsageError:
                continue
        if not made:
            break
        for name, candidates in made.items():  # layouts to choose from
            if isinstance(candidates, list):
                others = dict(zip(parameters, args)) | inputs
                made[name] = accepted(model, name, candidates, others, first=False)
        inputs |= made
    return args, inputs


def _side_input(name: str, config, given: dict[str, Any], device, *, batch: int,
                seq: int | None):
    import torch

    made = None
    if name in MASKS and MASKS[name] in given:
        made = mask(name, given[MASKS[name]], config, features_config(config), batch=batch)
    images = given.get("pixel_values")
    if (name == "image_attention_mask" and "input_ids" in given
            and isinstance(images, torch.Tensor) and images.dim() == 5):
        # IDEFICS: the images ``(batch, images, ...)`` each token attends to; every token
        # attends to every image: ones ``(batch, tokens, images)``.
        made = torch.ones(given["input_ids"].shape + images.shape[1:2], dtype=torch.long,
                          device=images.device)
    return made if made is not None else example(name, config, device, batch=batch, seq=seq)


def _patch_inputs(inputs: dict[str, Any], pixel_name: str, grid_input: str,
                  parameters: set[str], config, device, *, batch: int,
                  seq: int | None = None) -> None:
    """Qwen2-VL's image inputs in ``inputs``: the image as flattened patches with its patch
    grid (and its `merge_size` where forward takes one per image), and, in the tokens, one
    placeholder per image token (`image_placeholders`)."""
    vision = sub_config(config, "vision")
    # To choose from: flattened, each an image (Kimi-K2.5's), those as a batch (PaddleOCR-VL's).
    inputs[pixel_name] = patch_layouts(patches(vision, device, batch=batch), vision)
    inputs[grid_input] = grid(grid_input, vision, device, batch=batch)
    for name in parameters.intersection(MERGE_SIZES):  # VideoLLaMA 3's, with the grid
        inputs[name] = make(Wanted(name, config, device, batch, 1), (FAMILY,))
    image_placeholders(inputs, parameters, config, image_tokens(vision), seq)


def _has_sub_config(config, modality: str) -> bool:
    # Set, not merely declared: embedding_gemma2 keeps vision_config = None.
    return any(getattr(config, f"{modality}_{part}", None) is not None
               for part in ("config", "configs"))


def example(name: str, config, device, *, batch: int, seq: int | None):
    """The example for input ``name`` of a model with ``config``: what the first rule of the
    registry (`rules`) that makes one returns, the families' rules before the general ones."""
    value = make(Wanted(name, config, device, batch, seq))
    if value is None:
        raise UnknownInputError(f"exportflops does not know how to make an example {name!r} "
                                f"for {type(config).__name__}, and its forward requires it; "
                                f"pass the model's inputs with args= and kwargs=.")
    return value
