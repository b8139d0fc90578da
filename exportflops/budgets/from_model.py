"""The `TransformerConfig` of a built model, read from its config at the batch and sequence of
its token ids: what `compare` needs to set a budget beside that model's graph."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from .chinchilla import chinchilla
from .config import TransformerConfig
from .kaplan import kaplan
from .nanogpt import karpathy
from .palm import palm

#: Each budget by its name, a function of a `TransformerConfig`.
BUDGETS = {"karpathy": karpathy, "kaplan": kaplan, "chinchilla": chinchilla, "palm": palm}


def config_of(model: torch.nn.Module, args: tuple) -> TransformerConfig:
    """The budgets' description of ``model`` at the batch and sequence of its token ids
    (``args[0]``): a Hugging Face GPT-2, Llama, Mistral or Qwen2, or the gpt2 and llama
    examples. Another model is an `InputError` saying what to build instead."""
    config = getattr(model, "config", None)
    kind = type(config).__module__ + "." + type(config).__name__
    if hasattr(config, "model_type"):  # a Hugging Face config
        batch, seq = _batch_and_seq(model, args)
        try:
            return TransformerConfig.from_hf(config, seq_len=seq, batch=batch)
        except (ValueError, KeyError, AttributeError) as error:
            raise InputError(f"the budgets do not describe {config.model_type} ({error}); "
                             f"they know GPT-2, Llama, Mistral and Qwen2 layouts.") from None
    if kind == "exportflops.examples.gpt2.GPTConfig":
        # nanoGPT's forward without targets runs the head on the last position only.
        batch, seq = _batch_and_seq(model, args)
        return TransformerConfig.from_nanogpt(config, seq_len=seq, batch=batch,
                                              head_positions="last")
    if kind == "exportflops.examples.llama.LlamaConfig":
        batch, seq = _batch_and_seq(model, args)
        return TransformerConfig.from_meta_llama(config, seq_len=seq, batch=batch)
    raise InputError(f"a budget compares a transformer the budgets know (the gpt2 and llama "
                     f"examples, or hf: GPT-2, Llama, Mistral, Qwen2); {type(model).__name__} "
                     f"has no config they read. Use exportflops.budgets with a "
                     f"TransformerConfig of your own.")


def _batch_and_seq(model: torch.nn.Module, args: tuple) -> tuple[int, int]:
    ids = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if ids is None or ids.ndim != 2 or ids.dtype.is_floating_point:
        raise InputError(f"the budgets read batch and sequence from token ids (batch, seq) as "
                         f"forward's first argument; {type(model).__name__} was given "
                         f"{_describe(ids)}.")
    return int(ids.shape[0]), int(ids.shape[1])


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return "no tensor"
