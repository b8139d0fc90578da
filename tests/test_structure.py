"""The codebase's shape, as properties that can fail: imports run one way (no cycle, also through
a package), only capture/ traces and only graph/ and capture/ read ``node.meta``, records and
render load without torch, every public field says what it is, and a cost field exists in one
place."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import torch

import exportflops
from exportflops import Cost, Report, analyze, records
from exportflops.render import RenderOptions

PACKAGE = Path(exportflops.__file__).parent

#: Where each rule of the layout allows a thing: tracing in capture/ alone, ``node.meta`` read
#: in graph/ and capture/ alone (exportflops/*/__init__.py docstrings say what goes where).
TRACERS = {"export", "draft_export", "make_fx", "dynamo_graph_capture_for_export",
           "aot_export_joint_with_descriptors"}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: A record's display hooks: the methods a notebook calls on the value (Jupyter's
#: ``_repr_html_``, IPython's ``_ipython_display_``, ``to_pandas``), which load their renderer
#: when called. They are the one way back from records up to render; every other lazy import
#: counts as an edge.
DISPLAY_HOOKS = {"_repr_html_", "_ipython_display_", "to_pandas"}


def _imports(path: Path, root: Path) -> set[str]:
    """Modules of the package ``root`` that importing ``path`` runs, lazy imports in functions
    included (those of a display hook aside). Importing ``a.b.c`` runs the package ``a.b``
    first (its ``__init__``), unless the importer is inside ``a.b`` (then that package is
    already being imported)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    in_hooks = {id(inner) for hook in ast.walk(tree)
                if isinstance(hook, ast.FunctionDef) and hook.name in DISPLAY_HOOKS
                for inner in ast.walk(hook)}
    for node in ast.walk(tree):
        if id(node) in in_hooks:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import x` names a module
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _is_module(candidate, root) else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    found = {m for m in found if m.split(".")[0] == root.name}
    for module in list(found):
        parts = module.split(".")
        found.update(".".join(parts[:i]) for i in range(2, len(parts))
                     if not package.startswith(".".join(parts[:i])))
    return found - {root.name, name}


def _is_module(name: str, root: Path) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    # The top-level __init__ is the lazy facade (importlib by name), not a dependency.
    return {_module_name(p, root): _imports(p, root) for p in root.rglob("*.py")
            if p != root / "__init__.py"}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, path + [dep])):
                return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph of the package's top-level parts (a folder, or a module beside the folders:
    ``api``, ``compat``): an edge where any module of one imports a module of the other."""
    def part(module: str) -> str:
        names = module.split(".")
        return names[1] if len(names) > 1 else names[0]

    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        packages.setdefault(part(module), set()).update(
            part(dep) for dep in imported if part(dep) != part(module))
    return packages


def test_no_import_cycle_between_modules_of_the_package():
    assert _cycle(_graph()) is None


def test_no_import_cycle_between_packages_of_the_package():
    assert _cycle(_packages(_graph())) is None


def test_the_package_cycle_check_finds_a_cycle_that_no_module_closes(tmp_path):
    # api counts with parallel's rank module; parallel's analyses call api: no module cycle,
    # but the packages depend on each other (issue 49's {api, parallel}).
    root = tmp_path / "pkg"
    (root / "parallel").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "parallel" / "__init__.py").write_text("")
    (root / "parallel" / "ranks.py").write_text("rank = 0\n")
    (root / "parallel" / "experts.py").write_text("from ..api import analyze\n")
    (root / "api.py").write_text("from .parallel.ranks import rank\nanalyze = 1\n")
    assert _cycle(_graph(root)) is None
    assert _cycle(_packages(_graph(root))) == ["api", "parallel", "api"]


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_cycle_check_finds_a_cycle_through_a_package(tmp_path):
    # The shape of a cycle once in the package: a package's __init__ imports its report
    # module, which imports (lazily, in a function) a module that imports the package.
    root = tmp_path / "pkg"
    (root / "records").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "records" / "__init__.py").write_text("from .report import Report\n")
    (root / "records" / "report.py").write_text(
        "class Report:\n    def roofline(self):\n        from ..roofline import lines\n")
    (root / "roofline.py").write_text("from .records import Report\nlines = 1\n")
    assert _cycle(_graph(root)) == ["pkg.records", "pkg.records.report", "pkg.roofline",
                                    "pkg.records"]
    # A display hook's import is the one not counted; the roofline method's still is.
    (root / "records" / "report.py").write_text(
        "class Report:\n    def _repr_html_(self):\n        from ..roofline import lines\n")
    assert _cycle(_graph(root)) is None


def _attributes(path: Path) -> set[str]:
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute)}


def _called(path: Path) -> set[str]:
    """The names of the functions ``path`` calls (``torch.export.export(...)``: export)."""
    calls = [node.func for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call)]
    return ({f.attr for f in calls if isinstance(f, ast.Attribute)}
            | {f.id for f in calls if isinstance(f, ast.Name)})


def _stage(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def test_only_capture_traces_a_model():
    tracing = {str(p.relative_to(PACKAGE)): sorted(_called(p) & TRACERS)
               for p in PACKAGE.rglob("*.py") if _stage(p) != "capture"}
    assert {path: found for path, found in tracing.items() if found} == {}


def test_only_graph_and_capture_read_node_meta():
    readers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if _stage(p) not in ("graph", "capture") and "meta" in _attributes(p)]
    assert readers == []


def test_records_and_render_load_without_torch():
    modules = [_module_name(p, PACKAGE) for stage in ("records", "render")
               for p in (PACKAGE / stage).rglob("*.py")]
    script = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
              f"print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_saved_report_renders_without_torch(tmp_path):
    saved = tmp_path / "report.json"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    saved.write_text(analyze(model, (torch.randn(2, 4),)).model_dump_json())
    script = (f"import sys\nfrom exportflops.records import Report\n"
              f"from exportflops.render import flops_report\n"
              f"report = Report.model_validate_json(open({str(saved)!r}).read())\n"
              f"text = flops_report(report)\n"
              f"assert 'torch' not in sys.modules, 'torch was imported'\n"
              f"print(report.total.macs)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(2 * 4 * 3)  # batch 2 x in 4 x out 3


def _public_models() -> list[type[pydantic.BaseModel]]:
    return [cls for _, cls in inspect.getmembers(records, inspect.isclass)
            if issubclass(cls, records.Record) and cls is not records.Record] + [RenderOptions]


@pytest.mark.parametrize("model", _public_models(), ids=lambda m: m.__name__)
def test_every_public_record_field_has_a_description(model):
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert missing == []


def test_formulas_return_the_record_type_the_report_holds():
    assert Report.model_fields["total"].annotation is Cost
    assert not hasattr(exportflops, "Counts")  # one name for one class


def test_a_formula_returning_an_unknown_cost_field_is_an_error_not_a_dropped_field():
    """A cost field exists once, on Counts: a formula naming one that does not exist fails at
    its node instead of being mapped away by name."""
    def with_unknown_field(call):
        return Cost(flops=1, weight_bytes=4)

    report = analyze(torch.nn.Linear(4, 3), (torch.randn(2, 4),),
                     formulas={torch.ops.aten.linear.default: with_unknown_field})
    (linear,) = [n for n in report.nodes if n.op == "aten.linear.default"]
    assert linear.status == "error" and "weight_bytes" in linear.note
