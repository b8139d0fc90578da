"""Every torch release the package accepts: the formula table loads where a release lacks an op,
every private torch API is found through one module, and the first run is quiet.

This file is part of the core subset CI runs on each tested torch (tests/core_subset.txt)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import exportflops
from exportflops import torch_internals
from exportflops.errors import TorchFeatureError
from exportflops.formulas import FORMULAS, Cost, FormulaTable, absent_ops
from exportflops.formulas.registry import AbsentOp, aten, aten_ops
from exportflops.version import TESTED_TORCH, is_tested_torch

ROOT = Path(__file__).resolve().parents[1]

#: Ops the formula files name that a torch release no longer defines, with the first release
#: without it: aten.cholesky (deprecated for torch.linalg.cholesky) is gone from torch 2.14.
REMOVED = {"aten.cholesky": (2, 14)}

RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_every_op_the_formula_files_name_is_defined_or_known_removed_from_this_torch():
    # A name that is neither (a typo, or an op a new release dropped) fails here, not at import.
    assert set(absent_ops()) == {op for op, removed in REMOVED.items() if RELEASE >= removed}


def test_no_op_this_torch_lacks_is_registered():
    keys = [*FORMULAS.entries, *FORMULAS.value_dependent]
    assert [key for key in keys if isinstance(key, AbsentOp)] == []
    assert [key for key in keys if isinstance(key, str) and "::" not in key] == []


def test_a_formula_for_an_op_this_torch_lacks_is_skipped_and_listed():
    table = FormulaTable()
    table.register(aten.mm, aten.no_such_op, aten.no_such_op.default)(lambda call: Cost())
    table.register_zero([aten.other_missing_op], "a reason", moves="nothing")
    assert list(table.entries) == [torch.ops.aten.mm]
    assert absent_ops(table) == ["aten.no_such_op", "aten.no_such_op.default",
                                 "aten.other_missing_op"]
    assert isinstance(aten_ops("no_such_op")[0], AbsentOp)


def test_a_formula_table_that_fails_to_load_registers_nothing_and_fails_the_same_way_again():
    # A formula file that raises on import (as aten.cholesky did on torch 2.14): every attempt
    # must fail with that error, with nothing left registered, and a good load must then give
    # the full table.
    broken = run_python("""
        import importlib.abc, sys
        class Broken(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "exportflops.formulas.spectral":
                    raise RuntimeError("the spectral formulas are broken")
        sys.meta_path.insert(0, Broken())
        for attempt in range(2):
            try:
                import exportflops.formulas
            except Exception as error:
                table = sys.modules["exportflops.formulas.registry"].FORMULAS
                print(type(error).__name__, error, len(table.entries))
        sys.meta_path.pop(0)
        import exportflops.formulas
        print(len(exportflops.formulas.FORMULAS.entries))
    """)
    fresh = run_python("import exportflops.formulas as f; print(len(f.FORMULAS.entries))")
    assert broken.returncode == 0, broken.stderr
    failed_twice, loaded = broken.stdout.splitlines()[:2], broken.stdout.splitlines()[2]
    assert failed_twice == ["RuntimeError the spectral formulas are broken 0"] * 2
    assert loaded == fresh.stdout.strip() and int(loaded) > 900


def test_every_private_torch_feature_is_found_on_this_torch():
    assert is_tested_torch(torch.__version__)
    assert torch_internals.missing() == {}


def test_a_feature_this_torch_lacks_fails_only_the_analysis_that_needs_it(monkeypatch):
    monkeypatch.setitem(torch_internals._FEATURES, "fake_store", torch_internals.Feature(
        "torch.testing._internal.distributed.no_such_module:FakeStore", "fake_process_group"))
    with pytest.raises(TorchFeatureError) as caught:
        with exportflops.fake_process_group(2):
            pass
    message = str(caught.value)
    assert "fake_process_group needs torch.testing._internal.distributed.no_such_module" in message
    assert f"pip install torch=={TESTED_TORCH[-1]}" in message
    # 4 x 3 MACs a row, 2 rows: the rest of the package still counts.
    report = exportflops.analyze(nn.Linear(4, 3, bias=False), (torch.randn(2, 4),))
    assert report.total.macs == 2 * 4 * 3


def test_version_names_the_package_torch_and_transformers_and_whether_this_torch_is_tested():
    shown = subprocess.run([sys.executable, "-m", "exportflops", "--version"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stderr == ""
    lines = shown.stdout.splitlines()
    assert lines[0] == f"exportflops {exportflops.__version__}"
    assert lines[1] == f"torch {torch.__version__} (one the test suite runs on)"
    transformers = pytest.importorskip("transformers")
    assert lines[2] == f"transformers {transformers.__version__}"


@pytest.mark.parametrize("numpy", ["installed", "missing"])
def test_the_first_command_prints_the_report_and_nothing_on_stderr(numpy):
    # The README's first command, `exportflops gpt2`; without numpy, torch warns on import.
    hide = "sys.modules['numpy'] = None" if numpy == "missing" else ""
    shown = run_python(f"""
        import sys
        {hide}
        from exportflops.cli import main
        sys.exit(main(["gpt2"]))
    """)
    assert shown.returncode == 0
    assert shown.stderr == ""
    assert shown.stdout.startswith("Summary of GPT")


def test_the_api_prints_nothing_on_stderr_when_values_decide_a_branch_or_a_capture_fails():
    shown = run_python("""
        import torch
        from torch import nn
        import exportflops

        class ByValue(nn.Module):
            def __init__(self):
                super().__init__()
                self.wide, self.narrow = nn.Linear(16, 64), nn.Linear(16, 4)
            def forward(self, x, flags):
                return self.wide(x) if flags.sum() > 0 else self.narrow(x)

        for mode in ("forward", "train"):
            exportflops.analyze(ByValue(), (torch.randn(3, 16), torch.tensor([0, 1])),
                                mode=mode)

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        with exportflops.fake_process_group(4):
            mesh = init_device_mesh("cpu", (4,))
            with torch.device("meta"):
                # 30 output columns over 4 ranks: the split the capture cannot make.
                model = parallelize_module(nn.Sequential(nn.Linear(8, 30)), mesh,
                                           {"0": ColwiseParallel()})
                x = torch.randn(2, 8, device="meta")
            try:
                exportflops.analyze(model, (x,), mode="train")
            except exportflops.ExportFlopsError as error:
                print(type(error).__name__)
    """)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""


def test_an_fsdp2_module_without_the_private_state_memory_reads_fails_by_name():
    from exportflops.torch_internals import fsdp_all_gather_outputs

    class Moved(torch.nn.Module):  # a torch whose FSDP2 state moved: no _get_fsdp_state
        pass

    with pytest.raises(TorchFeatureError, match=r"memory_ranks under FSDP2 needs "
                                                r"FSDPModule\._get_fsdp_state"):
        fsdp_all_gather_outputs(Moved())
