"""Hugging Face models from their configs, never a download: ``hf:<model_type>`` (the type's
default config), ``hf:path/to/config.json`` or ``hf:path/to/dir``, and ``hf:org/name`` from the
local Hugging Face cache. The model class is the one transformers' own auto tables give the
config; the example inputs are `hf_inputs`'."""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import traceback
from typing import Any

from ..errors import BuildError, ExportError, UsageError
from ..capture.hints import first_lines, meta_only
from .inputs import UnknownInputError, hf_inputs
from .layers import cap_layers, layer_counts, sub_configs
from .kernels import check_pools
from .modalities import text_length
from .needs import innermost, needed_input, raised_by
from .parent import (
    held_in_composite, modeling_module, module_name, parent_inputs, takes_config_alone,
)
from .memory import free_bytes, memory_capped, out_of_memory

#: The auto classes tried first, in this order; then every other ``AutoModel*`` class by name.
#: An encoder-decoder's seq2seq classes come before ``AutoModelForCausalLM``, which would build
#: its decoder alone (``BartForCausalLM``, ``WhisperForCausalLM``).
SEQ2SEQ_AUTO = ("AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq")
#: A model with vision or audio towers takes these before ``AutoModel``, which drops the
#: language head (LlavaModel; LlavaForConditionalGeneration has it). ``AutoModelForCausalLM``
#: still comes first: where its table holds a multimodal type it builds the whole model
#: (Gemma 3) or the language model alone (MllamaForCausalLM, whose whole model torch.export
#: cannot trace on meta for most of them: Qwen3.5's image grid is split by its values).
MULTIMODAL_AUTO = ("AutoModelForImageTextToText", "AutoModelForMultimodalLM")
PREFERRED_AUTO = ("AutoModelForCausalLM", "AutoModel")
#: The most bytes of parameters and buffers of a model built on meta that is built again on
#: cpu (`analyze_deciding_on_cpu`): a vision tower a few layers deep, not a vocabulary's table.
CPU_REBUILD_BYTES = 2 * 2**30
#: The most memory that analysis on cpu may take beyond what the process held (less where the
#: machine has less free, `memory.free_bytes`): an example's
#: values can make the sizes they decide explode (LightGlue's detector finds a keypoint at
#: each pixel of a blank image and matches every pair: some 24 GiB).
CPU_RUN_BYTES = 8 * 2**30
#: The most layers (all stacks together) of a model built on meta that `_probe` runs as it is:
#: building a twin one layer deep costs about as much as a fake run of 8 layers (Llama and
#: Qwen2-MoE at 128 tokens: a twin built in 0.8-1.1 s, a fake run 0.1-0.2 s a layer, on two
#: busy cores), so a shallower model is probed itself.
PROBE_TWIN_PAST = 8
#: The sub-configs that make a config multimodal where they are set.
TOWERS = ("vision_config", "audio_config")
#: What the analysis turns off in every config that has it: the KV cache does not export
#: (shared/REFERENCES.md), and a prefill needs none.
NO_CACHE = {"use_cache": False}


class CpuRunError(ExportError):
    """The run on cpu that `analyze_deciding_on_cpu` turned to went past its memory cap; the
    hint names the arguments that make it smaller."""


def hf_model(spec: str, device, kwargs: dict | None, *, layers: int | None = None,
             batch: int = 1, seq: int | None = None,
             use_cache: bool = False) -> tuple[Any, tuple, dict]:
    """The model ``hf:spec`` names, at most ``layers`` layers deep, built on ``device``; its
    example positional args and keyword args (``kwargs`` added last). ``use_cache`` keeps the
    KV cache on (generation analyzes it); otherwise it is turned off (`NO_CACHE`)."""
    transformers = import_transformers(spec)
    config = hf_config(spec, transformers)
    model, args, inputs = _model_and_inputs(config, device, transformers, layers=layers,
                                            batch=batch, seq=seq, use_cache=use_cache)
    return model, args, inputs | (kwargs or {})


def split_sizes(spec: str, *, layers: int | None = None, seq: int | None = None
                ) -> tuple[int | None, int | None]:
    """What the flags that split ``hf:spec`` over ranks split, read from its config capped at
    ``layers`` and its model class (nothing is built): the layers of its one stack, where the
    class names one module the pipeline splits between (`parallel.pipeline.layer_split_points`
    splits between the modules of each name in ``_no_split_modules``: BERT's also name its
    embeddings, Mamba's a block's mixer); and the tokens of its example (``seq``, or the
    default `text_length`) where it is a causal LM of text alone. None where the config alone
    does not say (an encoder and a decoder, a vision tower, inputs other than text)."""
    transformers = import_transformers(spec)
    config = hf_config(spec, transformers)
    if layers is not None:
        cap_layers(config, layers)
    auto = _auto_class(config, transformers)
    try:  # the family's modeling module is imported here, as building the model would
        model_class = auto._model_mapping[type(config)] if auto is not None else None
    except (KeyError, ImportError):  # not mapped by its class, or a package missing: the
        model_class = None  # build that follows says which
    counts = [n for config_ in (config, *sub_configs(config))
              for n in layer_counts(config_).values()]
    one_stack = len(counts) == 1 and len(set(
        getattr(model_class, "_no_split_modules", None) or ())) == 1
    text = (auto is transformers.AutoModelForCausalLM
            and not any(getattr(config, tower, None) is not None for tower in TOWERS))
    return (counts[0] if one_stack else None,
            text_length(config.get_text_config(), seq) if text else None)


def _model_and_inputs(config, device, transformers, *, layers: int | None, batch: int,
                      seq: int | None, use_cache: bool, whole: bool = False
                      ) -> tuple[Any, tuple, dict]:
    """``config``'s model, capped at ``layers`` (the whole composite with ``whole``: see
    `build`), and its example inputs."""
    if layers is not None:
        cap_layers(config, layers)
    for config_ in (config, *sub_configs(config)) if not use_cache else ():
        for key, value in NO_CACHE.items():
            if hasattr(config_, key):
                setattr(config_, key, value)
    model = build(config, device, transformers, whole=whole)
    check_pools(model)
    model.eval()
    from .session import session_class, tracked_frame  # torch, imported when it is needed

    session = session_class(model)
    if session is not None:  # a video tracker: one frame of a session it builds from tensors
        return tracked_frame(model, session, config, device, batch=batch, seq=seq)
    try:
        args, inputs = hf_inputs(_probe(model, config, device, transformers, whole=whole),
                                 device, batch=batch, seq=seq, config=config)
    except UnknownInputError as missing:
        # A sub-model whose inputs another model computes (SAM's mask decoder): read them
        # from the composite model that holds it, built on meta around its config.
        def composite(parent_config):
            import torch

            return _model_and_inputs(parent_config, torch.device("meta"), transformers,
                                     layers=layers, batch=batch, seq=seq,
                                     use_cache=use_cache, whole=True)

        args, inputs = parent_inputs(model, config, device, composite, missing)
    return model, args, inputs


def _probe(model, config, device, transformers, *, whole: bool = False):
    """The model `hf_inputs` runs under fake tensors to find the inputs forward needs: on meta,
    a twin one layer deep where ``model`` holds more than `PROBE_TWIN_PAST` layers (which
    inputs a forward needs does not depend on its depth, and a fake run of every layer of a
    large model costs seconds); else ``model`` itself, as the inputs are made on its device."""
    if _device_type(device) != "meta" or sum(
            value for config_ in (config, *sub_configs(config))
            for value in layer_counts(config_).values()) <= PROBE_TWIN_PAST:
        return model
    twin = copy.deepcopy(config)
    cap_layers(twin, 1)
    try:
        return build(twin, device, transformers, whole=whole).eval()
    except BuildError:  # a config whose stacks cannot be one layer deep (Gemma 4's audio)
        return model


def _device_type(device) -> str:
    return getattr(device, "type", str(device).split(":")[0])


def import_transformers(spec: str):
    """The transformers module, imported reading the local cache only; ``spec`` names the model
    that needs it in the error where it is not installed."""
    # Before transformers (and huggingface_hub) read it: the cache only, never the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as error:
        raise UsageError(f"hf:{spec} needs the transformers package, which is not installed "
                         f"({error}); pip install transformers, or pass a pkg.module:factory "
                         f"that builds the model.") from None
    return transformers


def hf_config(spec: str, transformers):
    """The config ``spec`` names: a model type, a local config.json or folder, or a name in the
    local Hugging Face cache (read with ``local_files_only``)."""
    if spec in transformers.CONFIG_MAPPING:
        return transformers.AutoConfig.for_model(spec)
    if os.path.isfile(spec) or os.path.isdir(spec):
        return _local_config(spec, transformers)
    if "/" not in spec and not spec.endswith(".json"):
        raise UsageError(f"hf:{spec}: transformers {transformers.__version__} knows no "
                         f"model_type {spec!r}, and there is no file or folder of that name; "
                         f"write a config's model_type (gpt2, llama, bert, ...; "
                         f"transformers.CONFIG_MAPPING lists them all), hf:path/to/config.json, "
                         f"or hf:org/name of a model in the local Hugging Face cache.")
    if spec.endswith(".json") or spec.startswith((".", os.sep)):
        raise UsageError(f"hf:{spec}: no such file or folder; pass the path of a config.json "
                         f"or of the folder that holds it.")
    try:
        return transformers.AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError) as error:
        raise UsageError(f"hf:{spec} is not in the local Hugging Face cache "
                         f"({type(error).__name__}), and exportflops never downloads: fetch its "
                         f"config first (hf download {spec} config.json), or pass "
                         f"hf:path/to/config.json.") from None


def _local_config(path: str, transformers):
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"hf:{path}: cannot read {file} as a JSON config ({error}); pass a "
                         f"config.json written by save_pretrained, or its folder.") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if model_type not in transformers.CONFIG_MAPPING:
        raise UsageError(f"hf:{path}: {file} has model_type {model_type!r}, which transformers "
                         f"{transformers.__version__} does not know; a config written by "
                         f"save_pretrained names one of transformers.CONFIG_MAPPING.")
    try:
        return transformers.CONFIG_MAPPING[model_type].from_dict(data)
    except Exception as error:
        raise BuildError(f"transformers could not read {file} as a {model_type} config: "
                         f"{type(error).__name__}: {error}") from error


def build(config, device, transformers, *, whole: bool = False):
    """``config``'s model on ``device``: the first auto class whose table (transformers'
    ``MODEL_FOR_*_MAPPING_NAMES``) holds its type (``AutoModel`` first with ``whole``: a
    composite's every tower, not its language model alone), else the model class that declares
    this config class (the sub-model configs of composite models, such as
    ``align_vision_model``), else the module of that name in the composite that holds it
    (SAM's prompt encoder, built from the whole ``SamConfig``)."""
    model_class = held = None
    auto = _auto_class(config, transformers, whole=whole)
    if auto is None:
        model_class = _declaring_class(config)
        held = held_in_composite(config) if model_class is None else None
        if model_class is None and held is None:
            # A config transformers registers for a part it builds inside another model
            # (Gemma 4 Unified's vision embedder also takes the text config): transformers'.
            raise BuildError(f"transformers {transformers.__version__} has no model class for "
                             f"{type(config).__name__} ({config.model_type}): no auto table "
                             f"holds it, no model class declares it as its config_class, and no "
                             f"module of its model takes it alone. Analyze the model that "
                             f"holds it, or build the part in Python and call analyze().")
    name = (model_class or auto or held[0]).__name__
    try:
        with device:
            if held is not None:  # a module built from its composite's whole config
                module_class, composite = held
                return module_class(composite)
            if model_class is not None and hasattr(model_class, "_from_config"):
                return model_class._from_config(config)
            if model_class is not None:  # a module of the model, not a PreTrainedModel
                return model_class(config)
            return auto.from_config(config)
    except Exception as error:
        # transformers' message of a missing optional package starts on a new line: its first
        # line must still name the package.
        raise BuildError(f"transformers could not build {config.model_type} with {name} from "
                         f"this config: {type(error).__name__}: {str(error).strip()}") from error


def _auto_class(config, transformers, *, whole: bool = False):
    autos = _auto_tables(transformers)
    multimodal = any(getattr(config, tower, None) is not None for tower in TOWERS)
    first = ((SEQ2SEQ_AUTO if getattr(config, "is_encoder_decoder", False) else ())
             + PREFERRED_AUTO[:1] + (MULTIMODAL_AUTO if multimodal else ()) + PREFERRED_AUTO[1:])
    if whole:
        first = ("AutoModel", *first)
    for name in (*first, *sorted(set(autos) - set(first))):
        if config.model_type in autos.get(name, ()):
            return getattr(transformers, name)
    return None


def _auto_tables(transformers) -> dict[str, dict[str, Any]]:
    """Each ``AutoModel*`` class transformers has and its table, model type to class name (the
    ``MODEL_FOR_*_MAPPING_NAMES`` its ``_LazyAutoMapping`` reads), from ``models.auto.
    modeling_auto``, which defines them all and imports no model family. Not from every name
    the top level exports: transformers imports each on first access, so reading them all
    imports every family it has (some 15 s) to find one auto class."""
    modeling_auto = transformers.models.auto.modeling_auto
    return {name: value._model_mapping._model_mapping
            for name, value in vars(modeling_auto).items()
            if name.startswith("AutoModel") and isinstance(value, type)
            and getattr(value, "_model_mapping", None) is not None}


def _declaring_class(config):
    """The model class in the config's own ``modeling_*`` module whose ``config_class`` is the
    config's class; the base model (the shortest name ending in ``Model``) when several are.
    The class may be defined in a sibling module and imported there (BLIP's ``BlipTextModel``
    lives in ``modeling_blip_text``)."""
    module = modeling_module(config)
    if module is None:
        return None
    classes = [c for c in vars(module).values() if isinstance(c, type)
               and getattr(c, "config_class", None) is type(config)
               and not c.__name__.endswith("PreTrainedModel")]
    # The base model: a name ending in Model, the shortest (BlipTextModel, not
    # BlipTextLMHeadModel).
    classes.sort(key=lambda c: (not c.__name__.endswith("Model"), len(c.__name__)))
    return classes[0] if classes else _config_module(module, config)


def _config_module(module, config):
    """Where no model class declares the config (SAM's mask decoder, Idefics' vision tower):
    the module class of ``module`` whose constructor takes the config alone, the one named
    as the config (``SamMaskDecoderConfig``: ``SamMaskDecoder``), else the one with the most
    parameters (the outermost: Idefics' vision transformer holds its embeddings); none where
    the module so named takes another config (`held_in_composite` builds it)."""
    import torch

    modules = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, torch.nn.Module)]
    if any(c.__name__ == module_name(config) and not takes_config_alone(c, type(config))
           for c in modules):
        return None  # the module of that name takes the composite's config (SAM's prompts)
    classes = [c for c in modules if takes_config_alone(c, type(config))]
    named = [c for c in classes if c.__name__ == module_name(config)]
    if named or len(classes) < 2:
        return (named or classes or [None])[0]
    with torch.device("meta"):
        sizes = {c: sum(p.numel() for p in c(config).parameters()) for c in classes}
    return max(classes, key=sizes.get)


def analyze_deciding_on_cpu(analyze, model, args: tuple, kwargs: dict, on_cpu=None):
    """``analyze(model, args, kwargs)``; where ``model``, built on meta, fails to export as it
    would not on cpu (`meta_only`: a branch on its inputs' values, such as a vision tower
    splitting by its image grid; a tensor its code makes on cpu; a value it reads) and is small
    enough (`CPU_REBUILD_BYTES`), ``analyze`` of ``on_cpu()``'s model and inputs instead: on
    cpu the example's values decide each branch (`capture`). ``on_cpu`` None: never. A model
    built on meta may hold a few tensors its code puts on cpu (EnCodec's codebooks' ``inited``
    flags): one tensor on meta is enough for its values to be unknown."""
    try:
        return analyze(model, args, kwargs)
    except ExportError as error:
        tensors = [*model.parameters(), *model.buffers()]
        why = meta_only(error.__cause__ or error)
        if not (on_cpu is not None and why is not None
                and any(t.device.type == "meta" for t in tensors)
                and sum(t.numel() * t.element_size() for t in tensors) <= CPU_REBUILD_BYTES):
            raise
    cap = min(CPU_RUN_BYTES, free_bytes() or CPU_RUN_BYTES)
    with memory_capped(cap) as capped:
        try:
            return analyze(*on_cpu())
        except (ExportError, RuntimeError, MemoryError) as failure:
            if not (capped and out_of_memory(failure)):
                raise
            name = type(model).__name__
            raise CpuRunError(name, first_lines(failure), (
                f"{name} cannot be analyzed on meta ({why}), so it was built again on cpu and "
                f"run on its example; that run needed more than {cap / 2**30:.1f} GiB beyond "
                f"what the process held (the example's values may decide its sizes). Pass "
                f"device=\"cpu\", capped only at the memory the machine has free, or smaller "
                f"inputs (seq=, batch=, kwargs=).")) from failure


def missed_input(error: BaseException, model, args: tuple, kwargs: dict | None) -> str | None:
    """The input of ``model.forward`` that ``error`` shows forward needed and was not given
    (`needed_input`): a failure in transformers' code caused by the inputs we made, so ours."""
    parameters = list(inspect.signature(model.forward).parameters)
    given = set(parameters[:len(args)]) | set(kwargs or {})
    return needed_input(error, [p for p in parameters if p not in given])


def blame(error: BaseException, model=None, args: tuple = (), kwargs: dict | None = None) -> str:
    """``ours`` or ``theirs``: ours when the innermost frame of ``error`` (or of its cause) is
    in exportflops; when transformers' forward needed an input we did not make
    (`missed_input`); or when it rejected ours with a ValueError it raises (an input check:
    "Bbox is required", "Image features and image tokens do not match"). Theirs otherwise: a
    constructor that rejects its own default config or a config with no model class
    (`BuildError`), a check of the config's own fields ("Could not find a `sliding_window`
    argument in the config"), a forward torch.export cannot capture."""
    if isinstance(error, BuildError):  # transformers cannot build it from this config
        return "theirs"
    if raised_by(error).startswith("exportflops"):
        return "ours"
    if model is None:
        return "theirs"
    return ("ours" if _checked(error, model) or missed_input(error, model, args, kwargs)
            else "theirs")


def _checked(error: BaseException, model) -> bool:
    """Whether transformers' own code raised ``error``'s innermost cause as a ValueError with a
    ``raise`` statement about the inputs: an input check, not Python's unpacking or conversion
    errors, nor a check of the config that names none of forward's parameters."""
    cause = innermost(error)
    frames = traceback.extract_tb(cause.__traceback__)
    raised = (isinstance(cause, ValueError) and raised_by(cause).startswith("transformers")
              and bool(frames) and (frames[-1].line or "").lstrip().startswith("raise"))
    message = str(cause)
    # "the config" as a noun (not "configuration", not a field read as config.x).
    about_config = re.search(r"\bconfig\b(?!\.)", message) is not None and not any(
        re.search(rf"\b{re.escape(name)}\b", message)
        for name, p in inspect.signature(model.forward).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return raised and not about_config
