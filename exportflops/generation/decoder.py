"""analyze_generation(): the prefill, one decode step as polynomials of the context length, and
the whole request in closed form.

Two exports, never one per token: the forward over the prompt that fills the KV cache, and one
decode step (one new token per sequence) whose cache length is a dynamic size named ``past``.
Every count of the step is then a polynomial in ``past``, and the request's total is the
prefill plus that polynomial summed over ``past = P .. P + G - 2`` by sympy.

Hugging Face models go through transformers' own exportable caches: ``DynamicCache`` registered
as a pytree by ``transformers.integrations.executorch.register_dynamic_cache_export_support``,
and ``TorchExportableModuleWithStaticCache`` for a static cache. Nothing in transformers is
patched. The exported step's rebuild of the DynamicCache from its input tensors (a copy a
decode loop never makes) is removed before counting (`program_edits.drop_cache_rebuild`).
Encoder-decoder models: `generation_seq2seq`. The built-in Llama takes and returns its cache.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..api import collector_paused, count_captured
from .cache_names import cache_argument, returned_cache
from ..capture.export import capture_forward
from ..errors import GenerationError, InputError
from .forked import beside
from .limits import check_options, check_request
from .seq2seq import cache_zeros, kv_counts, seq2seq
from .sliding import cache_windows, decode_step
from ..graph.program_edits import name_input_sizes
from ..capture.quiet import quiet_fake_tensor_log
from ..records import Cost, Report
from ..records.generation import PAST, GenerationReport, request_total
from ..torch_internals import pytree, require
from ..graph.walk import example_value

#: The options of `analyze` that `analyze_generation` passes on to both analyses.
_ANALYZE_OPTIONS = ("strict", "formulas")


def analyze_generation(model: Any, input_ids: torch.Tensor, *, new_tokens: int,
                       cache: Literal["dynamic", "static"] = "dynamic",
                       max_cache_len: int | None = None, full_logits: bool = False,
                       **kwargs: Any) -> GenerationReport:
    """The cost of generating ``new_tokens`` tokens after the prompts ``input_ids`` (batch x P).

    ``cache="dynamic"`` counts the useful work: a cache that grows by one entry per step, the
    attention reading ``past + 1`` keys (a sliding-window layer at most its window's; see
    `GenerationReport.decode_windowed`). ``cache="static"`` counts the work as a static cache
    executes it: a buffer of ``max_cache_len`` entries (default P + ``new_tokens``), attended
    in full at every position. An encoder-decoder model whose encoder reads input features
    (Whisper) takes them as ``input_ids``, (batch, mel bins, frames). ``kwargs`` are
    `analyze`'s ``strict`` and ``formulas``, applied to both analyses. Works on ``meta``:
    nothing is allocated.

    The prefill is counted as transformers' ``generate`` runs it: where the model's forward
    takes ``logits_to_keep``, ``generate`` passes 1 and the LM head runs on the last position
    of each prompt only. ``full_logits=True`` counts the head on every prompt position (a
    forward that returns all the prompt's logits, as scoring does);
    `GenerationReport.prefill_logit_positions` says which was counted.

    A request the model cannot run is an `InputError` naming the limit (`generation.limits`): a
    prompt, or a prompt and new tokens, past a learned position table, a static cache too short;
    so is an argument out of its range (``new_tokens=0``, ``cache="paged"``,
    ``max_cache_len=0``: `generation.limits.check_options`).
    """
    with collector_paused():
        return _analyze_generation(model, input_ids, new_tokens, cache, max_cache_len,
                                   full_logits, kwargs)


def _analyze_generation(model: Any, input_ids: torch.Tensor, new_tokens: int, cache: str,
                        max_cache_len: int | None, full_logits: bool,
                        kwargs: dict) -> GenerationReport:
    batch, prompt_len = _check(model, input_ids, new_tokens, cache, kwargs, max_cache_len)
    if cache == "static" and max_cache_len is None:
        max_cache_len = prompt_len + new_tokens
    check_request(model, prompt_len, new_tokens, max_cache_len)
    # Each step's report names the model, not the wrapper of it that is counted.
    kwargs = {**kwargs, "name": type(model).__name__}
    logits = _prefill_logits(model, prompt_len, full_logits)
    if cache == "dynamic":
        prefill, decode, kv, dropped, windowed = _dynamic_steps(model, input_ids, logits,
                                                                kwargs)
    else:
        prefill, decode, kv = _static(model, input_ids, max_cache_len, logits, kwargs)
        dropped, windowed = [], {}
    name = type(model).__name__
    first = 1 if getattr(getattr(model, "config", None), "is_encoder_decoder", False) else None
    total = request_total(prefill.total, decode.total, first or prompt_len, new_tokens,
                          windowed=windowed["decode_windowed"].total if windowed else None,
                          window=windowed.get("sliding_window"))
    return GenerationReport(
        model=name, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, cache=cache,
        first_past=first, max_cache_len=max_cache_len,
        work="useful" if cache == "dynamic" else "executed",
        prefill_logit_positions=logits.positions,
        prefill=prefill, decode=decode, kv_cache=kv, dropped_nodes=dropped,
        total=total, **windowed)


@dataclass(frozen=True)
class _PrefillLogits:
    """How the prefill computes its logits."""

    positions: int
    """Positions per sequence the LM head runs on (`GenerationReport.prefill_logit_positions`)."""
    keep_last: bool
    """Pass ``logits_to_keep=1`` to the model's forward, as ``generate`` does."""

    @property
    def keywords(self) -> dict[str, int]:
        """The keywords of the prefill's call that say it."""
        return {"logits_to_keep": 1} if self.keep_last else {}


def _prefill_logits(model: Any, prompt_len: int, full_logits: bool) -> _PrefillLogits:
    """The prefill's logits as ``generate`` computes them (or every position's, with
    ``full_logits``). transformers' ``generate`` passes ``logits_to_keep=1`` to a model whose
    forward takes that keyword (``GenerationMixin._supports_logits_to_keep``: the name in
    ``inspect.signature(forward)``; its models slice the hidden states to the last position
    before the head, ``modeling_utils.slice_logits_to_keep``) and computes every position's
    logits otherwise."""
    if _is_reference_llama(model):
        last = model.config.logits_last_only
        if full_logits and last:
            raise GenerationError(
                f"{type(model).__name__} was built with logits_last_only=True: its forward "
                f"applies the output projection to the last position only, so it has no "
                f"full-logits prefill. Build it with logits_last_only=False to count one, or "
                f"drop full_logits.")
        return _PrefillLogits(1 if last else prompt_len, keep_last=False)
    if getattr(model.config, "is_encoder_decoder", False):
        return _PrefillLogits(1, keep_last=False)  # the decoder reads its start token alone
    keep = not full_logits and "logits_to_keep" in inspect.signature(model.forward).parameters
    return _PrefillLogits(1 if keep else prompt_len, keep_last=keep)


def _check(model: Any, input_ids: Any, new_tokens: Any, cache: Any, kwargs: dict,
           max_cache_len: Any = None) -> tuple[int, int]:
    unknown = sorted(set(kwargs) - set(_ANALYZE_OPTIONS))
    if unknown:
        raise TypeError(f"analyze_generation() got unknown keyword(s) {', '.join(unknown)}; "
                        f"it passes on {', '.join(_ANALYZE_OPTIONS)} to analyze().")
    check_options(new_tokens, cache, max_cache_len)
    if _takes_features(model):
        return _check_features(model, input_ids, cache)
    if (not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2
            or input_ids.dtype.is_floating_point or input_ids.shape[1] < 1):
        raise InputError(f"analyze_generation analyzes a model that generates tokens from a "
                         f"prompt of token ids (or from features: Whisper), and "
                         f"{type(model).__name__} does not take one: input_ids must be token "
                         f"ids, an integer tensor of shape (batch, prompt length >= 1), e.g. "
                         f"torch.zeros(1, 128, dtype=torch.long); it was given {_given(input_ids)}"
                         f". Analyze its forward with analyze() instead.")
    if _is_reference_llama(model):
        if cache == "static":
            raise GenerationError(
                f"{type(model).__name__}, the built-in Llama, keeps a growing cache; its "
                f"attention reads the entries written so far, as Meta's reference does with its "
                f"max_seq_len buffers. Analyze it with cache='dynamic'.")
        return input_ids.shape[0], input_ids.shape[1]
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    if text is None or not hasattr(model, "generation_config"):
        raise GenerationError(
            f"analyze_generation() takes a Hugging Face transformers model with a KV cache; "
            f"{type(model).__name__} is not one. For another model, export its decode step "
            f"with the cache length as a dynamic size and analyze(model, args, "
            f"dynamic_shapes=...) it.")
    main = getattr(model, "main_input_name", "input_ids")
    if main != "input_ids":
        raise GenerationError(
            f"{type(model).__name__} takes {main} into its encoder, not token ids; "
            f"analyze_generation's prompt is token ids (batch x P), or the input features of "
            f"an encoder-decoder model (Whisper). Analyze its encoder with "
            f"analyze(model.get_encoder(), ({main},)) and its decoder step with analyze(..., "
            f"dynamic_shapes=...) over the decoder's cache length.")
    _check_hf_cache(model, cache)
    return input_ids.shape[0], input_ids.shape[1]


def _given(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def _check_hf_cache(model: Any, cache: str) -> None:
    config = model.config
    if not getattr(config, "is_encoder_decoder", False):
        cache_windows(model)  # raises for a cache that is not keys and values
    elif cache == "static":
        raise GenerationError(
            f"{type(model).__name__} is an encoder-decoder model: its decode step is analyzed "
            f"with a dynamic cache only (transformers' static-cache export of the decoder "
            f"recomputes the encoder's keys and values at every step). Use cache='dynamic'.")
    if not getattr(config.get_text_config(), "use_cache", False):
        raise GenerationError(f"{type(model).__name__}'s config has use_cache=False: set "
                              f"model.config.use_cache = True to generate with a KV cache.")


def _takes_features(model: Any) -> bool:
    """An encoder-decoder model whose encoder reads input features (Whisper's log-mel
    spectrogram), not token ids."""
    config = getattr(model, "config", None)
    return getattr(model, "main_input_name", None) == "input_features" and \
        getattr(config, "is_encoder_decoder", False) and hasattr(model, "get_encoder")


def _check_features(model: Any, features: Any, cache: str) -> tuple[int, int]:
    """(batch, encoder positions) for a features prompt: the prompt length that the decoder's
    cross-attention reads (Whisper: frames / 2), from the encoder run on fake tensors."""
    name = type(model).__name__
    if not isinstance(features, torch.Tensor) or not features.dtype.is_floating_point \
            or features.ndim != 3:
        raise InputError(f"{name}'s encoder takes input_features: pass them as the prompt, a "
                         f"float tensor (batch, mel bins, frames) as its feature extractor "
                         f"makes them, e.g. torch.zeros(1, 80, 3000, device='meta') for "
                         f"Whisper.")
    _check_hf_cache(model, cache)
    from ..torch_internals import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            encoded = model.get_encoder()(input_features=features)
    except Exception as error:  # the encoder's own check of the features' shape
        raise InputError(f"{name}'s encoder rejects input_features of shape "
                         f"{tuple(features.shape)}: {error}") from error
    return features.shape[0], encoded[0].shape[1]


@contextlib.contextmanager
def dynamic_cache_pytree() -> Iterator[None]:
    """transformers' ``DynamicCache`` as a pytree (its own registration,
    ``register_dynamic_cache_export_support``) while this runs, and removed after unless it was
    registered before: whether a generation ran first must not change what ``analyze`` does
    with a cache elsewhere in the process."""
    from transformers import DynamicCache
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    if DynamicCache in pytree.SUPPORTED_NODES:
        yield
        return
    register_dynamic_cache_export_support()
    try:
        yield
    finally:
        pytree._deregister_pytree_node(DynamicCache)
        require("fx_pytree")._deregister_pytree_flatten_spec(DynamicCache)


def _dynamic(model, input_ids: torch.Tensor, logits: _PrefillLogits, options: dict) -> tuple:
    """The prefill, the decode step, its KV cache bytes, the cache-rebuild nodes left out, and
    GenerationReport's sliding-window fields (`generation_sliding`; empty without windows)."""
    from transformers import DynamicCache

    def prefill() -> Report:
        return count_captured(capture_forward(model, (), {
            "input_ids": input_ids, cache_argument(model): DynamicCache(config=model.config),
            "use_cache": True, **logits.keywords}), **options)

    with dynamic_cache_pytree(), beside(prefill, (model, input_ids)) as prefill_report:
        windows = cache_windows(model)
        # The step is exported at one cache length and holds for all: export specializes sizes 0
        # and 1, so the example is at least 2, and it must not be a full window's W - 1.
        length = max(input_ids.shape[1], 2)
        length += length + 1 in windows
        tensors = _cache_tensors(model, input_ids, length)
        decode, kv, dropped = decode_step(model, input_ids, [None] * len(windows), tensors,
                                          options)
        windowed = {}
        if any(windows):
            full, full_kv, _ = decode_step(model, input_ids, windows, tensors, options)
            windowed = {"sliding_window": next(w for w in windows if w),
                        "kv_cache_windowed": full_kv,
                        "decode_windowed": full}
        return prefill_report(), decode, kv, dropped, windowed


def _dynamic_steps(model: Any, input_ids: torch.Tensor, logits: _PrefillLogits,
                   options: dict) -> tuple:
    """The prefill and the decode step with a growing cache, by the kind of model; the built-in
    Llama and an encoder-decoder model compute the prefill's logits as `_prefill_logits` says
    without being told."""
    if _is_reference_llama(model):
        return _reference_llama(model, input_ids, options)
    if getattr(model.config, "is_encoder_decoder", False):
        return seq2seq(model, input_ids, options)
    return _dynamic(model, input_ids, logits, options)


def _is_reference_llama(model: Any) -> bool:
    from ..examples.llama import Llama

    return isinstance(model, Llama)


def _reference_llama(model, input_ids: torch.Tensor, options: dict) -> tuple:
    """The built-in Llama: ``model(tokens, [])`` is the prefill, ``model(token, cache)`` a step
    after the cache's entries (a (keys, values) pair per layer, (B, kv_heads, past, head_dim))."""
    with beside(lambda: count_captured(capture_forward(model, (input_ids, [])), **options),
                (model, input_ids)) as prefill:
        step = _reference_llama_step(model, input_ids, options)
        return (prefill(), *step, {})


def _reference_llama_step(model, input_ids: torch.Tensor,
                          options: dict) -> tuple[Report, Cost, list[str]]:
    config = model.config
    shape = (input_ids.shape[0], config.n_kv_heads, max(input_ids.shape[1], 2), config.head_dim)
    dtype = model.output.weight.dtype
    tensors = [torch.zeros(shape, dtype=dtype, device=input_ids.device)
               for _ in range(2 * config.n_layers)]
    layers = list(zip(tensors[::2], tensors[1::2]))
    length = {2: torch.export.Dim.DYNAMIC}
    captured = capture_forward(model, (input_ids[:, :1].clone(), layers), dynamic_shapes=(
        None, [(length, length)] * config.n_layers))
    # User inputs: tokens, then layer 0's keys; the model checks that every layer's cache
    # holds as many entries, so all lengths are this one size.
    name_input_sizes(captured.program, range(1, 1 + len(tensors)), 2, PAST)
    return count_captured(captured, **options), kv_counts(tensors), []


def _cache_tensors(model, input_ids: torch.Tensor, length: int) -> list[torch.Tensor]:
    """Zero keys then values, one per layer, (batch, kv_heads, length, head_dim), shaped as the
    model fills transformers' own cache: its key/value heads, and a multi-query or latent
    attention layout whose keys and values differ in width (`_cache_layout`)."""
    return [cache_zeros(shape, dtype, input_ids.device, length)
            for shape, dtype in _cache_layout(model, input_ids)]


def _cache_layout(model, input_ids: torch.Tensor) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of each key then each value tensor of transformers' own cache after a
    one-token prefill: run on fake tensors, or, where the model cannot run eagerly on fake
    tensors (a grouped-matmul MoE wants bf16 on cpu), read from that prefill's export (the
    path transformers takes under export). Needs `dynamic_cache_pytree`."""
    from ..torch_internals import FakeTensorMode
    from transformers import DynamicCache

    inputs = {"input_ids": input_ids[:, :1], "use_cache": True}
    cache = DynamicCache(config=model.config)
    try:
        with quiet_fake_tensor_log(), FakeTensorMode(allow_non_fake_inputs=True), \
                torch.no_grad():
            model(**inputs, **{cache_argument(model): cache})
    except Exception:  # noqa: BLE001 - the exported prefill's outputs instead
        cache = _exported_cache(model, inputs)
    if any(layer.keys is None for layer in cache.layers):
        raise GenerationError(
            f"{type(model).__name__}'s forward keeps no keys and values in transformers' "
            f"DynamicCache (a model with its own recurrent state, such as RWKV); "
            f"analyze_generation counts attention KV caches. Analyze its forward with "
            f"analyze(model, args) instead.")
    return [(tuple(t.shape), t.dtype) for t in
            [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]]


def _exported_cache(model, inputs: dict):
    """The cache a prefill's exported program returns, rebuilt on meta tensors."""
    from transformers import DynamicCache

    program = capture_forward(model, (), {**inputs, cache_argument(model):
                                          DynamicCache(config=model.config)}).program
    outputs = next(node for node in program.graph.nodes if node.op == "output").args[0]
    values = [torch.empty(example_value(node).shape, dtype=example_value(node).dtype, device="meta")
              if isinstance(node, torch.fx.Node) else node for node in outputs]
    return returned_cache(pytree.tree_unflatten(values, program.call_spec.out_spec))


def _static(model, input_ids: torch.Tensor, max_cache_len: int, logits: _PrefillLogits,
            options: dict) -> tuple[Report, Report, Cost]:
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    with _static_generation_config(model):
        wrapper = TorchExportableModuleWithStaticCache(
            model, batch_size=input_ids.shape[0], max_cache_len=max_cache_len,
            device=input_ids.device)
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    with _called_with(model, logits.keywords):
        prefill = count_captured(capture_forward(wrapper, (), {
            "input_ids": input_ids, "cache_position": torch.arange(prompt_len, device=device)}),
            **options)
    # The position is a value, not a shape: one graph serves every step.
    decode = count_captured(capture_forward(wrapper, (), {
        "input_ids": input_ids[:, :1].clone(),
        "cache_position": torch.tensor([prompt_len], device=device)}), **options)
    tensors = [t for layer in wrapper.static_cache.layers for t in (layer.keys, layer.values)]
    read = sum(t.numel() * t.dtype.itemsize for t in tensors)  # every entry, padding included
    return prefill, decode, Cost(bytes_read=read, bytes_written=read // max_cache_len)


@contextlib.contextmanager
def _called_with(model: torch.nn.Module, keywords: dict) -> Iterator[None]:
    """``model`` called with ``keywords`` added while this runs: transformers' static-cache
    wrapper calls the model with a fixed set of keywords (``logits_to_keep`` not among them),
    so a forward pre-hook adds them; it is removed afterwards, also on error."""
    if not keywords:
        yield
        return
    handle = model.register_forward_pre_hook(
        lambda _, args, given: (args, {**given, **keywords}), with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _static_generation_config(model) -> Iterator[None]:
    """transformers' static-cache wrapper accepts a model whose generation config asks for a
    static cache; the model's own config is put back afterwards, also on error."""
    own = model.generation_config
    static = copy.deepcopy(own)
    static.cache_implementation = "static"
    model.generation_config = static
    try:
        yield
    finally:
        model.generation_config = own
