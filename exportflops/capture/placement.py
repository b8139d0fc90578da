"""Where and on what a profiled call runs: one device for the model and its inputs, real data
(not meta), and inputs of the structure, shapes and dtypes the program was exported for and
the report counts.

Each check runs before anything is timed, so that a wrong call fails with a `ProfileError`
that names the input or parameter and the user's next step, not deep in a replay (a failed
export guard is a bare ``AssertionError``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from ..errors import ProfileError
from ..records import Report
from ..torch_internals import pytree


def wanted_device(device: str | torch.device | None) -> torch.device | None:
    """The device ``device=`` asks for (a CUDA device with its index); None when not asked."""
    if device is None:
        return None
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(
            f"device={str(device)!r} asks for CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). Profile on "
            f"device='cpu', or run where a GPU is visible."
        )
    if wanted.type not in ("cpu", "cuda"):
        raise ProfileError(f"profile() times on 'cpu' or 'cuda', not {wanted.type!r}")
    if wanted.type == "cuda" and wanted.index is None:
        wanted = torch.device("cuda", torch.cuda.current_device())
    return wanted


def check_runnable(module: torch.nn.Module, name: str, args: Any, kwargs: dict | None,
                   wanted: torch.device | None) -> torch.device:
    """The one device the call runs on; a clear error for meta tensors or devices that differ."""
    home = _state_device(module, name)
    inputs = [(input_name(path), leaf)
              for path, leaf in pytree.tree_leaves_with_path((args, kwargs or {}))
              if isinstance(leaf, torch.Tensor)]
    if home is None:
        home = inputs[0][1].device if inputs else torch.device("cpu")
    for where, tensor in inputs:
        if tensor.device.type == "meta":
            raise ProfileError(f"input {where} of {name} is on the meta device: profile() needs "
                               f"real inputs (analyze() counts meta ones)")
        if tensor.device != home:
            raise ProfileError(
                f"input {where} is on {tensor.device} but {name}'s parameters are on {home}: "
                f"move the inputs with .to({str(home)!r}) (or the model with "
                f"model.to({str(tensor.device)!r}))"
            )
    if wanted is not None and wanted != home:
        raise ProfileError(
            f"device={str(wanted)!r} was asked, but {name} and its inputs are on {home}. "
            f"profile() moves nothing (the exported graph can hold device constants): move the "
            f"model and inputs with .to({str(wanted)!r}) before profiling."
        )
    if home.type not in ("cpu", "cuda"):
        raise ProfileError(f"profile() times on 'cpu' or 'cuda'; {name} is on {home}")
    return home


def _state_device(module: torch.nn.Module, name: str) -> torch.device | None:
    """The device of every parameter and buffer (None without any); meta or several devices
    are errors."""
    state = dict((*module.named_parameters(), *module.named_buffers()))
    on_meta = [key for key, tensor in state.items() if tensor.device.type == "meta"]
    if on_meta:
        raise ProfileError(
            f"{name}'s parameters are on the meta device ({on_meta[0]} ...): they have no data "
            f"to run. analyze() counts a meta model; to time it, build it on a real device (or "
            f"model.to_empty(device=...) and initialize it)."
        )
    by_device: dict[str, list[str]] = defaultdict(list)
    for key, tensor in state.items():
        by_device[str(tensor.device)].append(key)
    if len(by_device) > 1:
        listed = "; ".join(f"{d}: {keys[0]}{' ...' if len(keys) > 1 else ''}"
                           for d, keys in by_device.items())
        raise ProfileError(f"{name}'s parameters and buffers are on several devices ({listed}); "
                           f"profile() times one device: move the model with model.to(device)")
    return torch.device(next(iter(by_device))) if by_device else None


def input_name(path: tuple) -> str:
    """``args[0]``, ``kwargs['mask']``: an input as the user wrote it, from its pytree path."""
    # keystr of ((args), {kwargs}): "[0][1]" is positional argument 1, "[1]['mask']" kwarg mask.
    keystr = pytree.keystr(path)
    if keystr.startswith("[0]"):
        return f"args{keystr[3:]}"
    return f"kwargs{keystr[3:]}"


def device_label(device: torch.device) -> str:
    """The device as a `RuntimeProfile` names it: the GPU's name, or the CPU's threads and
    vector capability."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})"


# --- inputs against the program -----------------------------------------------------------------

def flat_inputs(program: torch.export.ExportedProgram, args: tuple, kwargs: dict, *,
                error: type[Exception] = ProfileError) -> list:
    """The graph's user-input values: (args, kwargs) flattened as the program's in_spec says."""
    in_spec = program.call_spec.in_spec
    flat, spec = pytree.tree_flatten(_in_spec_order(program, args, kwargs))
    if in_spec is not None and spec != in_spec:
        raise error(f"The inputs do not have the structure the program was exported "
                           f"with: pass the arguments it was exported with (or export it with "
                           f"these).\nexpected: {in_spec}\ngot:      {spec}")
    return flat


def _in_spec_order(program: torch.export.ExportedProgram, args: tuple,
                   kwargs: dict) -> tuple[tuple, dict]:
    # Keyword arguments are matched by name: the caller's order is not the spec's.
    in_spec = program.call_spec.in_spec
    if in_spec is not None and in_spec.num_children == 2:
        kwargs_spec = in_spec.child(1)
        if set(kwargs) == set(kwargs_spec.context or ()):
            kwargs = {k: kwargs[k] for k in kwargs_spec.context}
    return args, kwargs


def check_inputs(program: torch.export.ExportedProgram, name: str, args: tuple,
                 kwargs: dict, *, error: type[Exception] = ProfileError) -> dict[Any, int]:
    """The inputs have the structure, shapes, dtypes (and constant values) the program was
    exported for; a dynamic size must lie in its range and agree wherever it appears. Raises
    ``error`` (`ProfileError` for profile(), `InputError` for analyze()). Returns the value the
    inputs give each dynamic size, keyed by torch's symbol."""
    flat_inputs(program, args, kwargs, error=error)  # the structure
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s.arg for s in program.graph_signature.input_specs
             if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    leaves = pytree.tree_leaves_with_path(_in_spec_order(program, args, kwargs))
    sizes: dict[Any, int] = {}  # a dynamic size's symbol -> the value the inputs give it
    for (path, given), arg in zip(leaves, specs):
        where = f"input {input_name(path)} of {name}"
        if isinstance(arg, torch.export.graph_signature.ConstantArgument):
            if given != arg.value:
                raise error(
                    f"{where} is {given!r}, but the program was exported with the constant "
                    f"{arg.value!r} (export fixes non-tensor inputs): export with {given!r}.")
            continue
        expected = placeholders[arg.name].meta.get("val")
        if isinstance(expected, torch.Tensor) and isinstance(given, torch.Tensor):
            _check_tensor(where, expected, given, program.range_constraints, sizes, error)
    return sizes


def check_counted_inputs(report: Report, args: tuple, kwargs: dict) -> None:
    """The inputs have the shapes the report counts: a report evaluated at one size of a dynamic
    program, timed at another, would divide one call's FLOPs by another's latency. Matched as a
    multiset: the report does not name its inputs, and keyword order may differ."""
    counted = [(t.dtype, t.shape) for t in report.inputs]
    given = [(str(t.dtype).removeprefix("torch."), list(t.shape))
             for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    unmatched = list(counted)
    for dtype, shape in given:
        match = next((c for c in unmatched if _fits(c, dtype, shape)), None)
        if match is None:
            break
        unmatched.remove(match)
    else:
        if not unmatched:
            return
    raise ProfileError(
        f"The report of {report.model} counts inputs of shapes {[c for _, c in counted]}, but "
        f"the inputs given have {[g for _, g in given]}: evaluate the report at the inputs' "
        f"sizes (report.evaluate(name=size, ...)) or pass inputs of the counted shapes."
    )


def _fits(counted: tuple[str, list], dtype: str, shape: list[int]) -> bool:
    # A size still written as an expression (one no count depends on) fits any value.
    counted_dtype, counted_shape = counted
    return counted_dtype == dtype and len(counted_shape) == len(shape) and all(
        isinstance(c, str) or c == g for c, g in zip(counted_shape, shape))


def _check_tensor(where: str, expected: torch.Tensor, given: torch.Tensor,
                  ranges: dict, sizes: dict, error: type[Exception]) -> None:
    if given.dtype != expected.dtype:
        raise error(
            f"{where} has dtype {given.dtype}, but the program was exported for "
            f"{expected.dtype}: pass {expected.dtype} inputs, or export with these.")
    if not _shape_fits(expected.shape, given.shape, ranges, sizes):
        raise error(
            f"{where} has shape {list(given.shape)}, but the program was exported for "
            f"{_shape_text(expected.shape, ranges)}: export it with inputs of these shapes (or "
            f"with dynamic_shapes= marking the sizes that vary, torch.export.Dim), or pass "
            f"inputs of the exported shapes.")


def _shape_fits(expected: torch.Size, given: torch.Size, ranges: dict, sizes: dict) -> bool:
    """Whether ``given`` fits ``expected``; binds each dynamic size's symbol in ``sizes``. A
    size derived from others (``2*s0``) is left to export's own guard."""
    if len(expected) != len(given):
        return False
    for dim, size in zip(expected, given):
        if isinstance(dim, int):
            if dim != size:
                return False
            continue
        symbol = dim.node.expr
        if symbol not in ranges:
            continue
        bound = ranges[symbol]
        if not bound.lower <= size <= bound.upper or sizes.setdefault(symbol, size) != size:
            return False
    return True


def _shape_text(shape: torch.Size, ranges: dict) -> str:
    """``[s0 in [2, 64], 32]``: a dynamic size with the range export allows."""
    def text(dim: Any) -> str:
        if isinstance(dim, int):
            return str(dim)
        bound = ranges.get(dim.node.expr)
        return f"{dim} in [{bound.lower}, {bound.upper}]" if bound is not None else str(dim)
    return "[" + ", ".join(text(dim) for dim in shape) + "]"
