"""Module attribution: the module tree, call counts and parameters per module.

Paths are ``named_modules()`` names, taken from each node's ``nn_module_stack``; parameters come
from the exported program's state dict, where a tied parameter is one tensor under two names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from .records.names import ancestors, parent, qualified_name
from .graph.walk import NodeCall


@dataclass
class ModuleInfo:
    """What the tree knows of one module before costs are added."""

    path: str
    type_name: str = ""
    calls: int = 0
    params: int = 0
    own_params: int = 0
    tied_params: list[str] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return 0 if self.path == "" else self.path.count(".") + 1


def module_tree(nodes: Iterable[NodeCall], parameters: Iterable[tuple[str, torch.Tensor]],
                model: torch.nn.Module | None,
                model_type: str) -> tuple[dict[str, ModuleInfo], dict[str, str]]:
    """Modules by path, parents before children, and the tied parameters (name -> counted name).

    ``parameters`` are every parameter under each of its names, in ``named_parameters()``
    order (`program_parameters`)."""
    tree: dict[str, ModuleInfo] = {"": ModuleInfo("", model_type)}
    call_keys: dict[str, set[str]] = defaultdict(set)

    def add(path: str) -> ModuleInfo:
        if path not in tree:  # a path in the tree has its ancestors there too
            for p in ancestors(path):
                tree.setdefault(p, ModuleInfo(p))
        return tree[path]

    if model is not None:
        for path, module in model.named_modules(remove_duplicate=False):
            add(path).type_name = qualified_name(type(module))
    frames = {frame for node in nodes for frame in node.stack}
    for frame in frames:
        info = add(frame.path)
        info.type_name = info.type_name or frame.type_name
        call_keys[frame.path].add(frame.call_key)
    for path, keys in call_keys.items():
        tree[path].calls = len(keys)
    tree[""].calls = max(tree[""].calls, 1)

    tied = _count_params(parameters, add)
    return dict(sorted(tree.items(), key=lambda item: (item[1].depth, item[0]))), tied


def extra_reprs(model: torch.nn.Module) -> dict[str, str]:
    """Each module's ``extra_repr()`` by every path that reaches it, for the tree views."""
    return {path: module.extra_repr()
            for path, module in model.named_modules(remove_duplicate=False)}


def program_parameters(program: torch.export.ExportedProgram
                       ) -> list[tuple[str, torch.Tensor]]:
    """The parameters a program lifted, under every name. Its state_dict keeps
    named_parameters() order, so the first name of a tied tensor is the one named_parameters()
    keeps too."""
    names = set(program.graph_signature.parameters)
    return [(name, tensor) for name, tensor in program.state_dict.items() if name in names]


def _count_params(parameters: Iterable[tuple[str, torch.Tensor]], add) -> dict[str, str]:
    counted_as: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, tensor in parameters:
        owner_path = parent(name)
        if id(tensor) in counted_as:
            tied[name] = counted_as[id(tensor)]
            add(owner_path).tied_params.append(name.rpartition(".")[2])
            continue
        counted_as[id(tensor)] = name
        add(owner_path).own_params += tensor.numel()
        for path in ancestors(owner_path):
            add(path).params += tensor.numel()
    return tied

