"""The only caller of ``torch.export``: a model, an ExportedProgram or a saved ``.pt2`` in, a
`Captured` program out. Export failures become `ExportError` with a hint."""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import sympy
import torch

from .draft_mends import values_propagated
from ..errors import ExportError, InputError
from .hints import data_dependent, first_lines, hint, undecided_hint
from .placement import check_inputs, flat_inputs, input_name
from .quiet import quiet, quiet_capture_log, quiet_fake_tensor_log
from .saved import load
from .shape_kernels import shape_kernels
from .tensor_meta import memory_formats_once
from ..torch_internals import FakeTensor, pytree, require
from ..graph.sizes import shape_env


@dataclass(frozen=True)
class Captured:
    program: torch.export.ExportedProgram
    name: str
    """The model's class, or the saved program's path."""
    module: torch.nn.Module | None
    """The user's module when one was given (it names modules that never ran)."""
    args: tuple
    kwargs: dict
    """The inputs counted: the user's, else the program's example inputs."""
    given_sizes: dict | None = None
    """For a program already exported and inputs the user gave for it (checked against it):
    the value of each of its dynamic sizes (torch's symbol -> int) in those inputs; for a
    program whose branches were decided by the example's values, or with sizes read from
    them, each data-dependent size's value in the example."""
    value_guards: tuple[str, ...] = ()
    """The conditions on the example's values that decided the program's branches, or the
    sizes read from them at their values (``Eq(u0, 3)``; see `Report.value_guards`)."""


def capture(target: Any, args: Any = (), kwargs: dict | None = None, *,
            dynamic_shapes: Any = None, forward_only: bool = False,
            by_values: bool = True) -> Captured:
    """Export ``target`` (or read the program it is). ``forward_only=True`` is for analyses
    that count the forward alone: export then runs without grad, so that a model's own
    ``no_grad`` regions (Hugging Face's rotary embeddings) leave no grad-mode switches for
    export to wrap into subgraphs, and without the source traceback it records per node; only
    train mode needs those, to find the ops a custom ``autograd.Function``'s forward ran
    (`walk._autograd_function`). Each is about a tenth of export's time; the ops are the same.
    A model that branches on its inputs' values, with real tensors and static sizes, has its
    branches decided by the example's values (`_decided_by_values`), and its sizes read from
    values measured on the example (`_sized_by_the_example`), unless ``by_values`` is False
    (the fast path's stubbed model, whose stubs' zeros are no example)."""
    if isinstance(target, (torch.export.ExportedProgram, str, os.PathLike)):
        return _captured_program(target, args, kwargs, dynamic_shapes)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        raise TypeError(f"analyze() takes a model instance, got the class {target.__name__}: "
                        f"pass {target.__name__}(...).")
    if not isinstance(target, torch.nn.Module):
        raise TypeError(
            f"analyze() takes an nn.Module, a torch.export.ExportedProgram or the path of one "
            f"saved with torch.export.save; got {type(target).__name__}."
        )
    args = as_args(args, target)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict of keyword arguments for "
                        f"{type(target).__name__}.forward, got {type(kwargs).__name__}.")
    name = type(target).__name__
    kwargs = kwargs or {}
    _check_leaves(name, args, kwargs)
    _check_dynamic_dims(target, args, kwargs, dynamic_shapes)
    # Sizes the user made dynamic stay so: values would fix them at the example's.
    by_values = by_values and by_example(target, args, kwargs, dynamic_shapes)
    # torch prints the partial graph of a data-dependent failure to stderr; where the values
    # then decide the branches that graph is no news, else it is passed on.
    printed = io.StringIO()
    try:
        with _exporting(forward_only, dynamic_shapes), quiet_capture_log(), \
                contextlib.redirect_stderr(printed) if by_values else contextlib.nullcontext():
            program = torch.export.export(target, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # torch raises many types; all become one error with a hint
        if not (by_values and data_dependent(error)):
            sys.stderr.write(printed.getvalue())
            raise ExportError(name, first_lines(error),
                              hint(error, target, (args, kwargs))) from error
        return _decided_by_values(target, args, kwargs, forward_only, error)
    sys.stderr.write(printed.getvalue())
    captured = Captured(program, name, target, args, kwargs)
    shaped = value_sizes(program.graph_module) if by_values else set()
    return _sized_by_the_example(captured, shaped) if shaped else captured


def without_cache(model: torch.nn.Module, args: Any, kwargs: dict | None,
                  dynamic_shapes: Any = None) -> tuple[dict | None, Any, str]:
    """``kwargs`` with ``use_cache=False`` added for a transformers model called as it comes,
    ``dynamic_shapes`` with that input's entry (none: a bool), and the note that says so; else
    all as given and no note. Such a model builds a
    ``DynamicCache`` by default (its config's ``use_cache``) and returns it, which torch.export
    cannot flatten; the cache serves generation (`exportflops.analyze_generation` counts a
    prefill and a decode step with it), and with it the forward also runs other code (the
    cache's concatenations, a mask built for a cache), so the forward counted is the one
    without it. Left as given: a model that is no transformers model or whose forward takes
    no ``use_cache``, a call that names ``use_cache`` or passes a cache, and a config whose
    ``use_cache`` is off already."""
    # Only a model of an imported transformers can be one (importing it costs seconds).
    as_given = kwargs, dynamic_shapes, ""
    pretrained = getattr(sys.modules.get("transformers"), "PreTrainedModel", None)
    if pretrained is None or not isinstance(model, pretrained):
        return as_given
    try:
        bound = inspect.signature(model.forward).bind_partial(
            *as_args(args, model), **(kwargs or {})).arguments
    except TypeError:
        return as_given  # export names the mismatch
    parameters = inspect.signature(model.forward).parameters
    caches = [name for name in ("cache", "past_key_values") if bound.get(name) is not None]
    config = model.config
    on = any(getattr(c, "use_cache", False) for c in (config, config.get_text_config()))
    if "use_cache" not in parameters or "use_cache" in bound or caches or not on:
        return as_given
    # torch.export matches dynamic_shapes to the inputs by name, or in order (kwargs last).
    if isinstance(dynamic_shapes, dict):
        dynamic_shapes = {**dynamic_shapes, "use_cache": None}
    elif isinstance(dynamic_shapes, (tuple, list)):
        dynamic_shapes = type(dynamic_shapes)([*dynamic_shapes, None])
    return ({**(kwargs or {}), "use_cache": False}, dynamic_shapes,
            f"use_cache=False passed to {type(model).__name__}: by default it returns a KV "
            f"cache, which serves generation (exportflops.analyze_generation counts it) and "
            f"which torch.export cannot return; counted as the forward without it")


def counted_eagerly(model: Any, dynamic_shapes: Any) -> bool:
    """Whether a model torch.export refused may be counted from one eager run instead
    (`capture.eager`; it must also run): a module called without dynamic sizes (those need
    export's symbols), holding no eager-mode quantized module (its packed weights go to
    ``quantized::`` kernels no formula counts; the refusal's hint says to analyze the float
    model, whose matmuls are the same MACs)."""
    return (isinstance(model, torch.nn.Module) and dynamic_shapes is None
            and not any(type(m).__module__.startswith("torch.ao.nn.quantized")
                        for m in model.modules()))


def by_example(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> bool:
    """Whether the example's values may decide ``model``'s program (its branches, its sizes
    read from values): its tensors are real and its sizes static (values would fix dynamic
    ones at the example's)."""
    return dynamic_shapes is None and all_real(model, args, kwargs)


def value_sizes(graph: torch.fx.GraphModule) -> set:
    """The sizes of tensors in ``graph``, or in a subgraph of it (a ``no_grad`` or autocast
    region, a ``torch.cond`` branch), read from a tensor's values: its unbacked symbols."""
    from ..torch_internals import free_unbacked_symbols

    return {symbol for module in graph.modules() if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes for leaf in pytree.tree_leaves(node.meta.get("val"))
            if isinstance(leaf, torch.Tensor) for symbol in free_unbacked_symbols(leaf)}


def _sized_by_the_example(captured: Captured, shaped: set) -> Captured:
    """``captured``, whose export passed with sizes read from the example's values unknown (a
    ``nonzero``, a ``.tolist()`` that no branch asks about), with each size's value in a run
    of the program on the example: counted there, as a program whose branches the values
    decided is, each listed as ``Eq(u0, 3)`` among the decisions. Where that run fails (the
    example breaks a check of the model's, or the memory runs out) the sizes stay symbols,
    which the report lists as data-dependent; so they do where the run gives some and not
    others (a ``torch.cond`` branch not taken). ``shaped``: the program's `value_sizes`."""
    try:
        with run_kept(captured.module, captured.args, captured.kwargs):
            sizes = _sizes_run(captured.program, captured.args, captured.kwargs)
    except Exception:  # noqa: BLE001 - the counts stay symbolic, which is right for any value
        return captured
    if not shaped <= sizes.keys():  # (an item() that only another size equals is not listed)
        return captured
    decided = tuple(f"Eq({symbol}, {value})" for symbol, value in sizes.items()
                    if symbol in shaped)
    return replace(captured, given_sizes=sizes, value_guards=decided)


@contextlib.contextmanager
def _exporting(forward_only: bool, dynamic_shapes: Any) -> Iterator[None]:
    # Export runs the forward on fake tensors; a failure halfway must not leave the caller's
    # random stream advanced (dropout draws), so it runs on a fork of it.
    static = dynamic_shapes is None
    with torch.random.fork_rng(devices=[]), _forward_only(forward_only), \
            quiet_fake_tensor_log(), _lazy_graph_code(), _fake_dispatch_cache(static), \
            contextlib.nullcontext() if static else shape_kernels(), \
            contextlib.nullcontext() if static else memory_formats_once():
        yield


def held_tensors(model: torch.nn.Module, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every parameter, buffer and input tensor of a call of ``model``."""
    return [*model.parameters(), *model.buffers(),
            *(leaf for leaf in pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor))]


def all_real(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Every parameter, buffer and input tensor holds values (none on meta, none fake)."""
    return all(t.device.type != "meta" and not isinstance(t, FakeTensor)
               for t in held_tensors(model, args, kwargs))


def _decided_by_values(model: torch.nn.Module, args: tuple, kwargs: dict, forward_only: bool,
                       error: Exception) -> Captured:
    """A model that branches on its inputs' values (a vision tower splitting by its image
    grid), exported by `torch.export.draft_export`: it runs the model on the real example
    alongside the fake one and decides each such branch as the example does, each decision a
    runtime assert of the program. The program is then run on the example, so that a
    decision its asserts refuse (torch got a value wrong) fails here, not as a count. The
    counts are the example's; the decisions are kept (`Report.value_guards`)."""
    name = type(model).__name__
    try:
        # torch warns of each branch it decides, and logs them to files: the report lists them.
        with _exporting(forward_only, None), run_kept(model, args, kwargs), \
                values_propagated(), _draft_log_in_a_temporary_folder(), \
                quiet(logging.ERROR, "torch.export._draft_export",
                       "torch.fx.experimental.symbolic_shapes"):
            step = "torch.export.draft_export"
            program = torch.export.draft_export(model, args, kwargs)
            step = "the program's run on the example"
            sizes = _sizes_run(program, args, kwargs)
    except Exception as failure:  # the first error is the one to act on
        raise ExportError(name, first_lines(error), undecided_hint(step, failure)) from error
    decided = [str(a.expr) for asserts in shape_env(program.graph).deferred_runtime_asserts
               .values() for a in asserts if a.msg.startswith("propagate_real_tensors")]
    return Captured(program, name, model, args, kwargs, sizes, tuple(dict.fromkeys(decided)))


def _sizes_run(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> dict:
    """The value of each data-dependent size of ``program`` on the example: read off a run of
    its graph, with the runtime asserts of its decisions, not off torch's propagation (which
    a torch version may get wrong, as 2.13 does without `draft_mends`)."""
    module = program.module()
    sizes = {}
    # The subgraphs sized by values (a no_grad or autocast region, a cond branch), run through
    # this interpreter for their sizes too; others run as they are (a scan's body, thousands
    # of times).
    sized = {id(graph) for graph in module.modules()
             if isinstance(graph, torch.fx.GraphModule) and value_sizes(graph)}

    class _Sizes(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            out = super().run_node(node)
            for fake, real in zip(pytree.tree_leaves(node.meta.get("val")),
                                  pytree.tree_leaves(out)):
                pairs = (zip(fake.shape, real.shape) if isinstance(fake, torch.Tensor)
                         and isinstance(real, torch.Tensor) else [(fake, real)])
                sizes.update(_symbol_values(pairs))
            return out

        def fetch_attr(self, target: str) -> Any:
            value = super().fetch_attr(target)
            return (lambda *args: _Sizes(value).run(*args)) if id(value) in sized else value

    # On copies: the unlifted program writes an input's in-place update back into it.
    inputs = pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
    with torch.no_grad():
        _Sizes(module).run(*flat_inputs(program, *inputs, error=ExportError))
    return sizes


def _symbol_values(pairs) -> dict:
    """Each torch size of ``pairs`` (fake, real) that is one symbol: an int's value; a
    condition's (``Eq(u0, 1)``, a tensor's truth read by a branch) 1 or 0."""
    values = {}
    for fake, real in pairs:
        expr = getattr(getattr(fake, "node", None), "expr", None)
        if isinstance(fake, torch.SymInt) and isinstance(expr, sympy.Symbol):
            values[expr] = int(real)
        elif (isinstance(fake, torch.SymBool) and isinstance(expr, sympy.Eq)
              and isinstance(expr.lhs, sympy.Symbol) and expr.rhs == 1):
            values[expr.lhs] = int(bool(real))
    return values


@contextlib.contextmanager
def run_kept(model: torch.nn.Module, args: tuple, kwargs: dict) -> Iterator[None]:
    """A real run of ``model`` on ``args`` and ``kwargs`` leaves no trace: its buffers, and the
    random state of cpu and of each cuda device its tensors are on, as they were."""
    cuda = sorted({t.get_device() for t in held_tensors(model, args, kwargs)
                   if t.device.type == "cuda"})
    with buffers_kept(model), torch.random.fork_rng(devices=cuda):
        yield


@contextlib.contextmanager
def buffers_kept(model: torch.nn.Module) -> Iterator[None]:
    """The model's buffers as they were, after runs that may update them in place (a batch
    norm's running statistics in train mode): an analysis leaves the model as it found it."""
    kept = [(b, b.clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)


@contextlib.contextmanager
def _draft_log_in_a_temporary_folder() -> Iterator[None]:
    """draft_export writes torch's structured trace to a file per call, under the temporary
    folder unless ``TORCH_DTRACE`` names one: here a folder removed afterwards, unless the user
    named one."""
    DTRACE_ENV_VAR = require("dtrace_env_var")

    before = os.environ.get(DTRACE_ENV_VAR)
    if before is not None:  # the user's own folder for torch's traces
        yield
        return
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        os.environ[DTRACE_ENV_VAR] = folder
        try:
            yield
        finally:
            del os.environ[DTRACE_ENV_VAR]


def capture_forward(target: Any, args: Any = (), kwargs: dict | None = None, *,
                    dynamic_shapes: Any = None) -> Captured:
    """`capture` for an analysis of the forward alone (``forward_only``: no grad, no source
    tracebacks)."""
    return capture(target, args, kwargs, dynamic_shapes=dynamic_shapes, forward_only=True)


def _lazy_graph_code():
    """Graph modules that generate their Python code when first run, not at every graph edit:
    export's passes recompile the graph a dozen times (a few hundred ms on a large model) and
    counting never runs it."""
    return require("use_lazy_graph_module")(True)


def _fake_dispatch_cache(enabled: bool):
    """Fake tensors' cache of op results, off for an export with dynamic sizes: there its
    entries (keyed and checked on symbolic sizes) cost more than they save, a third of the
    export of a GPT-2 block with a dynamic length (`benchmarks/sweep.py`); with static sizes
    it saves a sixth of a Llama-70B export."""
    return require("dynamo_config").patch(fake_tensor_cache_enabled=enabled)


@contextlib.contextmanager
def _forward_only(forward_only: bool) -> Iterator[None]:
    import torch.fx.config

    if not forward_only:
        yield
        return
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        with torch.no_grad():
            yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def _captured_program(target: Any, args: Any, kwargs: dict | None,
                      dynamic_shapes: Any) -> Captured:
    """A program exported already: its example inputs, and the user's inputs if given, which
    must fit it (the graph's shapes are fixed but for its dynamic sizes)."""
    program = target if isinstance(target, torch.export.ExportedProgram) else load(target)
    name = "ExportedProgram" if program is target else os.fspath(target)
    if dynamic_shapes is not None:
        raise InputError(f"dynamic_shapes applies when exporting a model; {name} is exported "
                         f"already (its dynamic sizes are fixed at export): export the model "
                         f"with dynamic_shapes=, or leave it out.")
    captured = Captured(program, name, None, *_example_inputs(program))
    if not kwargs and (args is None or (isinstance(args, (tuple, list)) and not args)):
        return captured
    given = (args,) if isinstance(args, torch.Tensor) else tuple(args or ())
    sizes = check_inputs(program, name, given, dict(kwargs or {}), error=InputError)
    return Captured(program, name, None, given, dict(kwargs or {}), sizes)


def _check_leaves(name: str, args: tuple, kwargs: dict) -> None:
    """Inputs export cannot take, named before it fails on them with a generic message."""
    for path, leaf in pytree.tree_leaves_with_path((args, kwargs)):
        if type(leaf).__module__ == "numpy" and hasattr(leaf, "shape"):
            kind = type(leaf).__name__
            raise InputError(f"input {input_name(path)} of {name} is a numpy {kind}; "
                             f"pass torch tensors: torch.from_numpy(x) (or torch.as_tensor).")


def _check_dynamic_dims(model: torch.nn.Module, args: tuple, kwargs: dict,
                        dynamic_shapes: Any) -> None:
    """Every dim named in ``dynamic_shapes`` exists in its tensor (torch says only "list
    assignment index out of range")."""
    if dynamic_shapes is None:
        return
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    except TypeError:
        return  # export reports the signature mismatch itself
    if isinstance(dynamic_shapes, dict):
        pairs = [(name, bound.get(name), spec) for name, spec in dynamic_shapes.items()]
    else:
        pairs = list(zip(bound, bound.values(), dynamic_shapes))
    for name, value, spec in pairs:
        if not isinstance(value, torch.Tensor) or spec is None:
            continue
        dims = list(spec) if isinstance(spec, dict) else list(range(len(spec)))
        for dim in dims:
            if not isinstance(dim, int) or not -value.ndim <= dim < value.ndim:
                raise InputError(
                    f"dynamic_shapes[{name!r}] names dim {dim!r}, but {name} of "
                    f"{type(model).__name__} has {value.ndim} dims (shape "
                    f"{list(value.shape)}): use dims 0..{value.ndim - 1}.")


def as_args(args: Any, model: torch.nn.Module) -> tuple:
    if isinstance(args, tuple):
        return args
    if isinstance(args, list):
        return tuple(args)
    if isinstance(args, torch.Tensor):
        return (args,)
    raise TypeError(
        f"args must be a tuple of {type(model).__name__}.forward's positional arguments "
        f"(or a single tensor), got {type(args).__name__}."
    )


def _example_inputs(program: torch.export.ExportedProgram) -> tuple[tuple, dict]:
    example = program.example_inputs
    return example if example is not None else ((), {})
