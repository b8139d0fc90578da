"""The entry points DeepSpeed's and fvcore's users know, as thin aliases of `analyze` and of the
`Report` queries: one implementation, two vocabularies.

Units are exportflops' own: a multiply-accumulate is 2 FLOPs and 1 MAC. fvcore's "flops" are
MACs (one fused multiply-add counted once), so fvcore's ``total()`` equals our ``macs``;
DeepSpeed's ``get_model_profile`` returns FLOPs as 2 per MAC, as here.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any, Literal

import torch

from .api import analyze
from .records import Report
from .render import flops_report
from .render.format import Style


def get_model_profile(model: torch.nn.Module, input_shape: tuple[int, ...] | None = None,
                      args: Any = (), kwargs: dict | None = None, *, print_profile: bool = True,
                      detailed: bool = True, module_depth: int = -1, top_modules: int = 1,
                      as_string: bool = True, output_file: str | os.PathLike | None = None,
                      ignore_modules: Collection[str] = (),
                      mode: Literal["forward", "train"] = "forward") -> tuple:
    """DeepSpeed's one call: ``flops, macs, params = get_model_profile(model, (1, 3, 224, 224))``.

    ``input_shape`` builds one input of that shape (on the model's device) when no ``args``
    are given: token ids (int64) for a model whose first parameters are an embedding's (a
    language model's input is ids, and an embedding refuses floats), else float32, as
    DeepSpeed does. Pass ``args`` for any other input. DeepSpeed's other arguments mean what
    they mean there. Prints (or writes
    to ``output_file``) `flops_report`'s summary, top and, when ``detailed``, tree views.
    Returns ``(flops, macs, params)``, as strings such as ``"8.24 G"`` when ``as_string``.
    """
    if input_shape is not None:
        if args:
            raise TypeError("get_model_profile() takes input_shape or args, not both")
        args = (torch.ones(tuple(input_shape), dtype=_input_dtype(model),
                           device=_device_of(model)),)
    report = analyze(model, args, kwargs, mode=mode)
    if print_profile or output_file is not None:
        text = flops_report(report, depth=module_depth, top=top_modules,
                            view=("summary", "top", "tree") if detailed else ("summary", "top"),
                            ignore_modules=tuple(ignore_modules))
        written_or_printed(text, output_file)
    values = (report.total.flops, report.total.macs, report.params)
    if not as_string:
        return values
    return tuple(Style().count(v, unit) for v, unit in zip(values, ("", "MACs", "")))


class FlopCountAnalysis:
    """fvcore's ``FlopCountAnalysis(model, inputs)`` and its queries over one `Report`.

    ``total``, ``by_module`` and ``by_module_and_operator`` return MACs, which is what fvcore
    calls flops; the full counts (FLOPs, MACs, bytes) are on ``.report``.
    """

    def __init__(self, model: Any, inputs: Any, **analyze_options: Any) -> None:
        self.report: Report = analyze(model, inputs if isinstance(inputs, tuple) else (inputs,),
                                      **analyze_options)

    def total(self, module_name: str = "") -> int:
        return self.report.module(module_name).inclusive.macs

    def by_operator(self, module_name: str = "") -> dict[str, int]:
        return {op: s.cost.macs for op, s in self.report.by_operator(module_name).items()}

    def by_module(self) -> dict[str, int]:
        return {path: counts.macs for path, counts in self.report.by_module().items()}

    def by_module_and_operator(self) -> dict[str, dict[str, int]]:
        return {path: {op: s.cost.macs for op, s in ops.items()}
                for path, ops in self.report.by_module_and_operator().items()}

    def unsupported_ops(self, module_name: str = "") -> dict[str, int]:
        return self.report.unsupported_ops(module_name)

    def uncalled_modules(self) -> set[str]:
        return self.report.uncalled_modules()


def _device_of(model: torch.nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _input_dtype(model: torch.nn.Module) -> torch.dtype:
    """int64 when the first module holding parameters (in registration order, where a
    model's input layer comes first) is an embedding, which takes token ids; else float32."""
    first = next((m for m in model.modules() if next(m.parameters(recurse=False), None)
                  is not None), None)
    embeddings = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return torch.long if isinstance(first, embeddings) else torch.float32


def written_or_printed(text: str, output_file: str | os.PathLike | None) -> None:
    """DeepSpeed's profilers write their text to ``output_file`` when given, else print it."""
    if output_file is None:
        print(text, end="")
        return
    with open(output_file, "w", encoding="utf-8") as f:
        f.write(text)
