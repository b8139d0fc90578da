"""Which input a forward needed and did not get, read from the error it raised: the name whose
value was None in the innermost frame of transformers' code ("'NoneType' object has no
attribute 'sum'" at ``input_features_mask.sum(-1)``: AudioFlamingo3; at ``grid_thw.device``:
Qwen2-VL's vision tower, whose model passes ``image_grid_thw``). A forward's signature makes
these optional; its code needs them. `hf_inputs` makes the input so named; the sweep blames a
failure on us when forward needed an input we did not make. And the token ids a forward refuses
(`refused_ids`), which it takes as embeddings; and whose code raised an error (`raised_by`).
The error itself comes from a run of the forward under fake tensors (`fake_error`), or, past
a branch fake tensors cannot decide, on the real inputs of a model on a real device."""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import re
import traceback
from typing import Any

#: An attribute read or an item read on a name: ``x.attr`` or ``x[``.
_READ = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\.\s*[A-Za-z_]|\[)")
#: Any name.
_NAME = re.compile(r"\b([A-Za-z_]\w*)\b")
#: A keyword argument passed a name: ``key=value``.
_KEYWORD = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*([A-Za-z_]\w*)\b")


def innermost(error: BaseException) -> BaseException:
    """The error at the end of ``error``'s chain of causes (what torch.export wraps)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def none_reads(error: BaseException) -> list[str]:
    """The names whose None value ``error``'s innermost frame read an attribute or item of (or
    iterated over, or passed to an op), and, one frame up at a time while the None came from
    there, the names that frame passed down as None (LongT5's ``x.shape`` in a helper is
    ``attention_mask`` in its caller); empty when ``error`` is not such a use of a None."""
    error = innermost(error)
    if not isinstance(error, (AttributeError, TypeError)) or "NoneType" not in str(error):
        return []
    frames = list(traceback.walk_tb(error.__traceback__))
    summaries = traceback.extract_tb(error.__traceback__)  # with each statement's last line
    names: list[str] = []
    read = "has no attribute" in str(error) or "not subscriptable" in str(error)
    for (frame, _), summary in zip(reversed(frames), reversed(summaries)):
        # The whole statement: a call spread over lines names its arguments on the later ones.
        line = "".join(linecache.getline(summary.filename, n) for n in
                       range(summary.lineno, (summary.end_lineno or summary.lineno) + 1))
        local = frame.f_locals
        # The innermost frame read an attribute or item of the None, or else iterated over it
        # or passed it to an op (LLaVA-NeXT: ``for imsize in image_sizes``; BLT: a Linear's
        # ``input``); its callers passed it on.
        pattern = _READ if read and not names else _NAME
        none = [name for name in pattern.findall(line) if name in local and local[name] is None]
        # In a caller, the argument bound to the None parameter by keyword, else every None
        # the call passes (Kosmos-2: img_input_mask=image_embeds_position_mask).
        bound = [value for key, value in _KEYWORD.findall(line)
                 if names and key == names[-1] and value in none]
        found = bound or list(dict.fromkeys(none))
        if not found and names and ("/torch/" in summary.filename.replace("\\", "/")
                                    or _passes_on(frame, line)):
            # torch's module call machinery (eager or export's), or a decorator's wrapper
            # (transformers' deprecate_kwarg since 5.24): passes *args on.
            continue
        if not found:
            break
        names += found
    return names


def _passes_on(frame, line: str) -> bool:
    """Whether ``line`` of ``frame`` calls on with the frame's own ``*args``: ``return
    func(*args, **kwargs)`` in a wrapper, not an unpacking of some other tuple
    (``x.view(1, *shape)``)."""
    code = frame.f_code
    if not code.co_flags & inspect.CO_VARARGS:
        return False
    star = code.co_varnames[code.co_argcount + code.co_kwonlyargcount]
    return re.search(rf"\(\s*(?:\w+\s*,\s*)?\*{star}\b", line) is not None


def raised_by(error: BaseException) -> str:
    """Whose code raised ``error`` (or the cause it chains): ``transformers``, ``torch``,
    ``exportflops``, or ``other``, by the file of the innermost frame, with its line."""
    error = innermost(error)
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "other"
    where = frames[-1].filename.replace(os.sep, "/")
    for package in ("transformers", "torch", "exportflops"):
        if f"/{package}/" in where:
            return f"{package} ({where.rpartition(f'/{package}/')[2]}:{frames[-1].lineno})"
    return "other"


def needed_input(error: BaseException, parameters) -> str | None:
    """The parameter of forward (among ``parameters``) that ``error`` shows forward needed: the
    name read while None (`none_reads`), or the one parameter it ends (``grid_thw`` is
    ``image_grid_thw`` one call up: the image's before the video's)."""
    for name in none_reads(error):
        if name in parameters:
            return name
        ending = next((p for p in parameters if p.endswith(f"_{name}")), None)
        if ending is not None:
            return ending
    return None


def refused_ids(error: BaseException, parameters: list[str], args: tuple,
                 inputs: dict) -> bool:
    """Whether ``error`` is transformers' own ValueError naming the ``input_ids`` it was given
    (not decoder_input_ids), where forward takes ``inputs_embeds`` instead."""
    given = set(parameters[:len(args)]) | set(inputs)
    cause = innermost(error)
    return ("input_ids" in given and "inputs_embeds" in parameters
            and "inputs_embeds" not in given and isinstance(cause, ValueError)
            and raised_by(cause).startswith("transformers")
            and re.search(r"\binput_ids\b", str(cause)) is not None)


def fake_error(model, args: tuple, kwargs: dict[str, Any], *,
               past_values: bool = False) -> Exception | None:
    """What ``model``'s forward raises with these inputs under fake tensors (shapes only, no
    arithmetic, on any device), or None. Fake tensors check shapes as torch.export does; meta
    kernels alone pass a layer norm over the wrong dimension (wav2vec2-BERT's). An op whose
    output depends on the values (``nonzero``, ``.item()``: EnCodec's padding, Idefics2's image
    positions), which fake tensors cannot run and export traces, is None too: the inputs'
    shapes carried forward that far. ``past_values``: there, where the model and inputs are
    real, a real run goes on to the next input forward reads while None (`none_reads`), and
    that is the error; only the search for such inputs asks, for a real run costs a forward
    and its values can fail where export would not (LightGlue's keypoints)."""
    from ..torch_internals import (
        DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode,
    )

    from ..capture.export import all_real

    try:
        with fake_forward():
            model(*args, **kwargs)
    except (DataDependentOutputException, DynamicOutputShapeException,
            GuardOnDataDependentSymNode):
        # Real tensors decide what fake ones cannot (a model built on cpu to have its branches
        # on values decided: `capture`), and run on to what the forward needs next (Moshi's
        # depth decoder reads its last_hidden_state after a branch on each position).
        if not (past_values and all_real(model, args, kwargs)):
            return None
        error = _real_error(model, args, kwargs)
        return error if error is not None and none_reads(error) else None
    except Exception as error:  # the caller reads it; None where export traces past it: a pad
        # by an unbacked size (Mimi's), a read of a meta input's values (Kimi-K2.5's .tolist())
        return None if any(m in str(error) for m in ("only concrete integers",
                                                     "unallocated storage")) else error
    return None


def _real_error(model, args: tuple, kwargs: dict[str, Any]) -> Exception | None:
    """What ``model``'s forward raises on the real inputs, or None, in torch's exporting state
    as in `fake_forward`; its buffers and the random state left as they were."""
    import torch

    from ..capture.export import run_kept
    from ..torch_internals import compiling_state_context

    try:
        with torch.no_grad(), compiling_state_context(), run_kept(model, args, kwargs):
            model(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the caller reads it
        return error
    return None


@contextlib.contextmanager
def fake_forward():
    """Fake tensors as torch.export runs a forward: with a shape environment, so that
    ``.item()`` and ``nonzero`` give unbacked sizes and the run goes on to what export meets
    after them; and in torch's own exporting state, in which transformers makes no default
    masks (LongT5 builds an attention_mask of ones unless torch.compiler.is_compiling())."""
    import torch

    from ..capture.quiet import quiet_fake_tensor_log
    from ..torch_internals import FakeTensorMode, ShapeEnv, compiling_state_context

    fake = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    with torch.no_grad(), quiet_fake_tensor_log(), compiling_state_context(), fake:
        yield
