"""The memory view of a hand-made report: its columns add up, its tree is indented."""

from __future__ import annotations

from exportflops.records.memory import KindBytes, MemoryPoint, MemoryReport, ModuleMemory
from exportflops.render.format import Style
from exportflops.render.memory import memory_view

AT_PEAK = KindBytes(parameters=400, gradients=100, optimizer=804, activations=1000,
                    temporaries=50, inputs=16)
PEAK = 400 + 100 + 804 + 1000 + 50 + 16


def _report() -> MemoryReport:
    point = MemoryPoint(index=7, op="aten.mm.default", module="block.fc", phase="backward",
                        live=AT_PEAK)
    modules = [ModuleMemory(path="", type="Net", depth=0, activations=1000, own_activations=0,
                            largest_temporary=50, largest_temporary_op="aten.mm.default"),
               ModuleMemory(path="block", type="Block", depth=1, activations=1000,
                            own_activations=200, largest_temporary=50),
               ModuleMemory(path="block.fc", type="Linear", depth=2, activations=800,
                            own_activations=800, largest_temporary=50)]
    return MemoryReport(model="Net", mode="train", optimizer="adamw", allocator="exact",
                        peak_bytes=PEAK, peak_phase="backward", peak_node="aten.mm.default #7",
                        peak_module="block.fc", by_kind=AT_PEAK,
                        max_by_kind=AT_PEAK.model_copy(update={"gradients": 400}),
                        modules=modules, timeline=[point])


def test_the_kinds_at_the_peak_add_up_to_the_total_row():
    text = memory_view(_report(), Style(as_string=False))
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines()
            if line.split() and line.split()[0] in (*KindBytes.model_fields, "total")}
    assert sum(int(rows[kind]) for kind in KindBytes.model_fields) == int(rows["total"]) == PEAK


def test_the_title_names_the_peak_and_the_tree_indents_each_level():
    text = memory_view(_report())
    assert text.splitlines()[0] == (
        "Memory of Net: training step (adamw, step 2 of the loop); peak 2.37 kB in the "
        "backward at aten.mm.default #7 in block.fc; storage bytes")
    assert "\n  block " in text and "\n    block.fc " in text
    assert "block.fc" not in memory_view(_report(), max_depth=1).split("Per module")[1]


def test_on_a_device_the_view_adds_whether_it_fits_and_minus_one_shows_every_level():
    from exportflops.records.memory import MemoryOnDevice

    report = _report()
    on_device = MemoryOnDevice(memory=report, fit=report.fits("t4"))
    text = memory_view(on_device, max_depth=-1)
    assert text.startswith(memory_view(report, max_depth=-1))
    assert text.splitlines()[-1].startswith("Fits t4: peak 2.37 kB")  # PEAK 2,370 B
    assert "block.fc" in text.split("Per module")[1]  # depth 2: -1 shows every level
