"""Names the records use: module paths as ``named_modules()`` writes them, and class names.

Torch-free, so that attribution, aggregation and the renderers share one definition.
"""

from __future__ import annotations


def ancestors(path: str) -> list[str]:
    """``"a.b"`` -> ``["", "a", "a.b"]``: the path and every module above it, root first."""
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def parent(path: str) -> str:
    """``"a.b"`` -> ``"a"``; the root's children -> ``""``."""
    return path.rpartition(".")[0]


def join(parent_path: str, name: str) -> str:
    """A child's path: ``join("", "a")`` is ``"a"``, ``join("a", "0")`` is ``"a.0"``."""
    return f"{parent_path}.{name}" if parent_path else name


def short_name(dotted: str) -> str:
    """``torch.nn.modules.linear.Linear`` -> ``Linear``; ``blocks.0.attn`` -> ``attn``."""
    return dotted.rpartition(".")[2]


def qualified_name(cls: type) -> str:
    """``torch.nn.modules.linear.Linear``: the name the module tree records a class by."""
    return f"{cls.__module__}.{cls.__qualname__}"


def outermost_named(paths, name: str) -> list[str]:
    """The ``paths`` whose last part is ``name`` and that lie inside no other such path, in
    the order given (each parent before its children, as ``named_modules()`` and the report's
    module list give them)."""
    found: list[str] = []
    for path in paths:
        if short_name(path) == name and not any(path.startswith(f"{outer}.") for outer in found):
            found.append(path)
    return found


class Moved:
    """Module paths written anew (``paths``: old path -> new), wherever a name holds one: a
    module's path, a parameter's module part, a node's block part (a node copied into a
    repeated block is named ``"<its path>:<name>"``). What a call alike another's (a pipeline
    stage of the same layers as an earlier one) is reported under its own names with."""

    __slots__ = ("paths",)

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths

    def path(self, path: str) -> str:
        return self.paths.get(path, path)

    def parameter(self, name: str) -> str:
        owner, _, leaf = name.rpartition(".")
        return join(self.path(owner), leaf)

    def node(self, name: str) -> str:
        owner, colon, rest = name.rpartition(":")
        return f"{self.path(owner)}{colon}{rest}"

    def node_record(self, node):
        """A `NodeRecord` under the new paths: its name, module and the node it differentiates."""
        return node.model_copy(update={"name": self.node(node.name),
                                       "module": self.path(node.module),
                                       "differentiates": self.node(node.differentiates)})

    def collective(self, collective):
        """A `Collective` under the new paths: its module and node."""
        return collective.model_copy(update={"module": self.path(collective.module),
                                             "node": self.node(collective.node)})
