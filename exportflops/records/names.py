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
