"""The inputs of a sub-model read from the composite model that holds it: a SAM mask decoder
takes the image embeddings and prompt embeddings its ``SamModel`` computes, a DETR decoder the
encoder's memory and the text features. No config says their shapes; the composite's own
forward does. The composite (the config in the same ``configuration_*`` module that lists the
sub-model's config class among its ``sub_configs``) is built on meta around the sub-model's
config, given its own example inputs, and traced by torch.export until it calls a module of
the sub-model's class; the arguments of that call, as zeros of their shapes and dtypes, are the
sub-model's example inputs. A module whose constructor takes the composite's whole config
(SAM's prompt encoder) is built from the composite config around the sub-model's."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from ..capture.first_call import first_call
from ..errors import BuildError, UsageError


def parent_configs(config) -> list[tuple[Any, str]]:
    """The composite configs that could hold ``config``, each with the sub-config key that
    holds it, built around a copy of ``config``: from the config classes of ``config``'s own
    ``configuration_*`` module whose ``sub_configs`` name its class (SAM's for its mask
    decoder). Those whose constructor rejects the sub-config are left out."""
    module = importlib.import_module(type(config).__module__)
    found = []
    for cls in vars(module).values():
        sub_configs = getattr(cls, "sub_configs", None) if isinstance(cls, type) else None
        if not isinstance(sub_configs, dict) or cls is type(config):
            continue
        for key, sub_class in sub_configs.items():
            if sub_class is not type(config):
                continue
            try:
                found.append((cls(**{key: config.to_dict()}), key))
            except Exception:  # noqa: BLE001 - a composite that cannot hold this config
                continue
    return found


def module_name(config) -> str:
    """The name of the module a sub-config configures: ``SamPromptEncoderConfig``'s is
    ``SamPromptEncoder``."""
    return type(config).__name__.removesuffix("Config")


def held_in_composite(config) -> tuple[type, Any] | None:
    """The module class named as ``config`` (`module_name`) in its ``modeling_*`` module and
    the first composite config of `parent_configs` its constructor takes alone (SAM's prompt
    encoder takes the whole ``SamConfig``); None when there is none."""
    module_class = getattr(modeling_module(config), module_name(config), None)
    if not isinstance(module_class, type):
        return None
    for parent_config, _ in parent_configs(config):
        if takes_config_alone(module_class, type(parent_config)):
            return module_class, parent_config
    return None


def modeling_module(config):
    """The ``modeling_*`` module beside ``config``'s ``configuration_*`` module, or None."""
    try:
        return importlib.import_module(
            type(config).__module__.replace(".configuration_", ".modeling_"))
    except ImportError:
        return None


def takes_config_alone(cls, config_class) -> bool:
    """Whether ``cls``'s constructor takes one argument, a ``config_class``."""
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    required = [p for p in parameters if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return (len(required) == 1 and required[0] is parameters[0]
            and parameters[0].annotation in (config_class, config_class.__name__))


def parent_inputs(model, config, device, make: Callable[[Any], tuple[Any, tuple, dict]],
                  missing: UsageError) -> tuple[tuple, dict[str, Any]]:
    """``model``'s example ``(args, kwargs)``, as the first composite of `parent_configs` that
    builds (``make(parent_config)`` gives its model on meta and its example inputs) calls a
    module of ``model``'s class; else ``missing`` (the error that said which input we cannot
    make), with why each composite did not tell: a `BuildError` (transformers') where
    transformers builds none of them here (EdgeTAM's needs timm), else a `UsageError`."""
    why, unbuilt = [], []
    for parent_config, key in parent_configs(config):
        name = type(parent_config).__name__
        try:
            parent, args, kwargs = make(parent_config)
            call = first_call(parent, args, kwargs, type(model))
            prompted = _prompted(parent, args, kwargs)
            if call is None and prompted is not kwargs:  # it runs only when prompted
                call = first_call(parent, args, prompted, type(model))
            if call is not None:
                return _examples(call[0], device), _examples(call[1], device)
        except Exception as error:  # noqa: BLE001 - told to the user in the error below
            if isinstance(error, BuildError):  # make's: transformers could not build it
                unbuilt.append(error)
            why.append(f"{name} ({key}): {type(error).__name__}: {_first_sentence(error)}")
            continue
        why.append(f"{name} ({key}): its forward did not call a {type(model).__name__}")
    if not why:
        raise missing
    message = f"{missing} Nor could it be read from the composite model that holds this config: "
    if len(unbuilt) == len(why):  # transformers builds none of them here: transformers' failure
        raise BuildError(message + "; ".join(why) + ".") from unbuilt[0]
    raise UsageError(message + "; ".join(why) + ".") from None


def _prompted(parent, args: tuple, kwargs: dict) -> dict:
    """``kwargs`` with one box per example where ``parent``'s forward takes box prompts and
    none were given: SAM 3 runs its geometry encoder only on boxes, ``(batch, boxes, 4)``."""
    import torch

    given = list(args) + list(kwargs.values())
    first = next((v for v in given if isinstance(v, torch.Tensor)), None)
    if (first is None or "input_boxes" in kwargs
            or "input_boxes" not in inspect.signature(parent.forward).parameters):
        return kwargs
    return kwargs | {"input_boxes": torch.zeros((first.shape[0], 1, 4), device=first.device)}


def _examples(value, device):
    """``value`` with each tensor replaced by zeros of its shape and dtype on ``device`` (a
    fake tensor of the composite's run is no input to export); a size that depends on the
    composite's values is no example."""
    import torch

    if isinstance(value, torch.Tensor):
        shape = [_size(size) for size in value.shape]
        return torch.zeros(shape, dtype=value.dtype, device=device)
    if isinstance(value, (list, tuple)):
        return type(value)(_examples(item, device) for item in value)
    if isinstance(value, dict):
        return {key: _examples(item, device) for key, item in value.items()}
    return value


def _size(size) -> int:
    try:
        return int(size)
    except Exception as error:  # a SymInt with no hint: .item() or nonzero upstream
        raise UsageError(f"a size of this input depends on the composite model's values "
                         f"({size}); pass the model's inputs with args= and kwargs=."
                         ) from error


def _first_sentence(error: BaseException) -> str:
    """The first sentence of ``error``'s message, which says what went wrong (the rest is
    advice for that model, not for this one), without its period."""
    text = " ".join(str(error).split())
    end = text.find(". ")
    return (text if end < 0 else text[:end]).rstrip(".")
