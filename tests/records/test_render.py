"""flops_report views, CSV and Markdown, on small models whose counts are derived by hand here.

TwoLayerMLP(32, 64, 10) on (4, 32) (float32, 4 bytes an element):
  1. fc1: 4*32*64 = 8,192 MACs; FLOPs 2*8,192 + bias 4*64 = 16,640.
     Reads x 4*32*4 = 512 B, weight 64*32*4 = 8,192 B, bias 64*4 = 256 B: 8,960 B;
     writes 4*64*4 = 1,024 B.
  2. act (ReLU): 4*64 = 256 FLOPs; reads and writes 1,024 B.
  3. fc2: 4*64*10 = 2,560 MACs; FLOPs 2*2,560 + 4*10 = 5,160.
     Reads 1,024 + 10*64*4 + 10*4 = 3,624 B; writes 4*10*4 = 160 B.
  Total MACs 10,752; FLOPs 16,640 + 256 + 5,160 = 22,056; matmul FLOPs 2*10,752 = 21,504;
  bytes read 8,960 + 1,024 + 3,624 = 13,608; written 1,024 + 1,024 + 160 = 2,208.
  Params fc1 32*64 + 64 = 2,112, fc2 64*10 + 10 = 650: 2,762.

LeNet5 on (1, 1, 32, 32):
  1. conv1 1->6, 5x5 -> 6x28x28: 6*28*28 * 1*5*5 = 117,600 MACs; FLOPs 2*117,600 + bias
     6*28*28 = 239,904. Reads 32*32*4 = 4,096 + 6*25*4 = 600 + 24 = 4,720 B;
     writes 6*28*28*4 = 18,816 B.
  2. relu 4,704 FLOPs; max_pool 2x2 -> 6x14x14: 3 comparisons per output, 3*1,176 = 3,528 FLOPs.
  3. conv2 6->16, 5x5 -> 16x10x10: 16*10*10 * 6*5*5 = 240,000 MACs; FLOPs 480,000 + 1,600 =
     481,600. Reads 6*14*14*4 = 4,704 + 16*6*25*4 = 9,600 + 64 = 14,368 B;
     writes 16*100*4 = 6,400 B.
  4. relu 1,600; max_pool -> 16x5x5: 3*400 = 1,200 FLOPs; flatten is a view: 0.
  5. fc1 400->120: 48,000 MACs, 96,120 FLOPs; fc2 120->84: 10,080 MACs, 20,244 FLOPs;
     fc3 84->10: 840 MACs, 1,690 FLOPs; relus 120 + 84.
  MACs 117,600 + 240,000 + 48,000 + 10,080 + 840 = 416,520.
  FLOPs 239,904 + 481,600 + 96,120 + 20,244 + 1,690 (conv, linear) + 6,508 (relu)
        + 4,728 (max_pool) = 850,794.
  Params 6*25+6 = 156; 16*150+16 = 2,416; 400*120+120 = 48,120; 120*84+84 = 10,164;
         84*10+10 = 850: 61,706.

BlockStack(8) on (2, 8): a block is fc 2*8*8 = 128 MACs (256 + 16 bias FLOPs), relu 16, residual
  add 16: 304 FLOPs, 72 params; three of them 384 MACs, 912 FLOPs, 216 params. up 8->16: 256 MACs,
  544 FLOPs, 144 params; the wide block: 512 MACs, 1,024 + 32 + 32 + 32 = 1,120 FLOPs, 272 params;
  head 16->1: 32 MACs, 66 FLOPs, 17 params. Total 1,184 MACs, 2,642 FLOPs, 649 params.

The goldens in tests/goldens/ were read and every number in them checked against these
derivations (the tests below assert the underlying counts too). After a deliberate change of
layout, regenerate with ``EXPORTFLOPS_REGOLD=1 python -m pytest tests/records/test_render.py``
and read the diff before committing it.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

from exportflops import Report, analyze, flops_report, to_csv, to_markdown
from exportflops.records import ModuleTiming, RuntimeProfile, Timing
from exportflops.render import RenderOptions
from tests.models import BlockStack, LeNet5, TwoLayerMLP

GOLDENS = Path(__file__).parents[1] / "goldens"
VIEWS = ["summary", "top", "tree", "operators", "module_operators"]

HAND = {
    "mlp": {"macs": 10_752, "flops": 22_056, "params": 2_762,
            "bytes_read": 13_608, "bytes_written": 2_208,
            "macs_by_module": {"fc1": 8_192, "act": 0, "fc2": 2_560},
            "flops_by_module": {"fc1": 16_640, "act": 256, "fc2": 5_160}},
    "lenet": {"macs": 416_520, "flops": 850_794, "params": 61_706,
              "bytes_read": 309_288, "bytes_written": 58_408,
              "macs_by_module": {"conv1": 117_600, "conv2": 240_000, "fc1": 48_000,
                                 "fc2": 10_080, "fc3": 840},
              "flops_by_module": {"conv1": 239_904, "conv2": 481_600, "fc1": 96_120,
                                  "fc2": 20_244, "fc3": 1_690}},
    "blocks": {"macs": 1_184, "flops": 2_642, "params": 649,
               "macs_by_module": {"blocks": 384, "up": 256, "wide": 512, "head": 32},
               "flops_by_module": {"blocks": 912, "up": 544, "wide": 1_120, "head": 66}},
}


def goldened(report: Report) -> Report:
    """``report`` as the goldens were rendered, on torch 2.13.0+cpu: another torch's version
    string has another width, which widens the summary's columns."""
    return report.model_copy(update={"torch_version": "2.13.0+cpu"})


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {"mlp": goldened(analyze(TwoLayerMLP(), (torch.randn(4, 32),))),
            "lenet": goldened(analyze(LeNet5(), (torch.randn(1, 1, 32, 32),))),
            "blocks": goldened(analyze(BlockStack(), (torch.randn(2, 8),)))}


@pytest.fixture(scope="module")
def train_mlp() -> Report:
    return goldened(analyze(TwoLayerMLP(), (torch.randn(4, 32),), mode="train"))


@pytest.fixture(scope="module")
def dynamic_mlp() -> Report:
    return goldened(analyze(TwoLayerMLP(), (torch.randn(4, 32),),
                            dynamic_shapes=({0: Dim("batch", max=64)},)))


@pytest.fixture(scope="module")
def timed_mlp(reports) -> Report:
    """The MLP with latencies set by hand (a real profile's numbers change every run):
    fc1 2 ms, act 0.5 ms, fc2 1.5 ms, so the nodes sum to 4 ms; the plain forward takes 5 ms
    (min 4.5, max 6), the hooked replay 5.2 ms: overhead 0.2 ms, residual 5 - 4 = 1 ms.
    Achieved 22,056 FLOPs / 5 ms = 4,411,200 FLOP/s; against a 1 GFLOP/s peak, MFU 0.44112%."""
    runtime = RuntimeProfile(
        device="cpu (test)", timer="set by hand", warmup=1, repeat=3, nodes=[],
        modules=[ModuleTiming(path="", inclusive_s=0.004, exclusive_s=0.0),
                 ModuleTiming(path="fc1", inclusive_s=0.002, exclusive_s=0.002),
                 ModuleTiming(path="act", inclusive_s=0.0005, exclusive_s=0.0005),
                 ModuleTiming(path="fc2", inclusive_s=0.0015, exclusive_s=0.0015)],
        hooked_total=Timing(median_s=0.0052, min_s=0.005, max_s=0.006),
        plain_total=Timing(median_s=0.005, min_s=0.0045, max_s=0.006),
        overhead_s=0.0002, residual_s=0.001, peak_flop_per_s=1e9, peak_source="user",
        achieved_flop_per_s=4_411_200.0, mfu=0.0044112)
    return reports["mlp"].model_copy(update={"runtime": runtime})


def golden(name: str, text: str) -> None:
    """Compare ``text`` with tests/goldens/``name``; the versions line is a placeholder there."""
    text = "\n".join("versions  <torch and exportflops versions>" if line.startswith("versions")
                     else line for line in text.splitlines()) + "\n"
    path = GOLDENS / name
    if os.environ.get("EXPORTFLOPS_REGOLD"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden"


@pytest.mark.parametrize("model", list(HAND))
def test_counts_behind_the_goldens_equal_the_hand_derivation(reports, model):
    report, hand = reports[model], HAND[model]
    assert (report.total.macs, report.total.flops, report.params) == (
        hand["macs"], hand["flops"], hand["params"])
    if "bytes_read" in hand:
        assert (report.total.bytes_read, report.total.bytes_written) == (
            hand["bytes_read"], hand["bytes_written"])
    assert {p: report.module(p).inclusive.macs for p in hand["macs_by_module"]} == \
        hand["macs_by_module"]
    assert {p: report.module(p).inclusive.flops for p in hand["flops_by_module"]} == \
        hand["flops_by_module"]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", ["mlp", "lenet"])
def test_each_view_matches_its_golden(reports, model, view):
    golden(f"{model}_{view}.txt", flops_report(reports[model], view=view))


def test_identical_numbered_siblings_collapse_into_one_row(reports):
    tree = flops_report(reports["blocks"], view="tree")
    golden("blocks_tree.txt", tree)
    assert "(0)..(2): Block x 3" in tree and "(wide): Block" in tree
    expanded = flops_report(reports["blocks"], view="tree", collapse=False)
    assert "x 3" not in expanded
    assert all(f"({i}): Block" in expanded for i in range(3))


def test_a_report_with_latencies_shows_latency_achieved_flops_and_mfu(timed_mlp):
    golden("mlp_timed_summary.txt", flops_report(timed_mlp, view="summary"))
    golden("mlp_timed_tree.txt", flops_report(timed_mlp, view="tree"))
    golden("mlp_timed_top.txt", flops_report(timed_mlp, view="top"))


def test_train_mode_shows_forward_backward_and_their_ratio(train_mlp):
    """Backward of the MLP, by hand (x needs no gradient, so fc1 computes no input gradient):
    fc1 weight grad 64*4*32 = 8,192 MACs (16,384 FLOPs) + bias grad sum 4*64 = 256: 16,640;
    act: threshold_backward 256; fc2 input grad 4*10*64 = 2,560 MACs and weight grad 2,560 MACs
    (10,240 FLOPs) + bias grad 40: 10,280. Backward 27,176 FLOPs, 13,312 MACs; forward 22,056;
    ratio 27,176 / 22,056 = 1.232; matmul 2*13,312 / 21,504 = 1.238.
    Backward bytes read: fc2 grad_in mm 160 + 2,560, grad_w mm 160 + 1,024, bias sum 160;
    threshold_backward 1,024 + 1,024; fc1 grad_w mm 1,024 + 512, bias sum 1,024: 8,672 (total
    13,608 + 8,672 = 22,280). Written: 1,024 + 2,560 + 40 + 1,024 + 8,192 + 256 = 13,096 (total
    15,304). Nodes: 3 forward; fc1 t, mm, t, sum, view, t; act detach, threshold_backward; fc2 t,
    mm, t, mm, t, sum, view, t: 19."""
    assert (train_mlp.backward.flops, train_mlp.backward.macs) == (27_176, 13_312)
    assert (train_mlp.total.bytes_read, train_mlp.total.bytes_written) == (22_280, 15_304)
    assert train_mlp.forward.flops == HAND["mlp"]["flops"]
    golden("mlp_train_summary.txt", flops_report(train_mlp, view="summary"))
    golden("mlp_train_tree.txt", flops_report(train_mlp, view="tree"))


def test_counts_of_a_dynamic_size_render_as_expressions(dynamic_mlp):
    """Per example row of batch B: fc1 (2*32*64 + 64) B = 4,160 B; act 64 B; fc2 (2*64*10 + 10) B
    = 1,290 B; total 5,514 B FLOPs, 2,688 B MACs. Shares do not depend on B:
    4,160/5,514 = 75.44%."""
    assert dynamic_mlp.total.flops == 5_514 * dynamic_mlp.total.flops.free_symbols.pop()
    golden("mlp_dynamic_summary.txt", flops_report(dynamic_mlp, view="summary"))
    golden("mlp_dynamic_tree.txt", flops_report(dynamic_mlp, view="tree"))
    for view in ("top", "operators", "module_operators"):
        assert "5450*batch" in flops_report(dynamic_mlp, view=view)  # both linears: 4,160 + 1,290


def test_markdown_holds_every_view_as_a_github_table(reports):
    golden("lenet_report.md", to_markdown(reports["lenet"], view=VIEWS))


def test_raw_integers_with_as_string_false_and_columns_sum_to_the_root(reports):
    """torchinfo's check: the children's params and MACs, read back from the printed table, sum
    to the root's (LeNet5's root runs no contraction itself)."""
    text = flops_report(reports["lenet"], view="tree", as_string=False, tablefmt="tsv")
    header, *rows = [line.split("\t") for line in text.splitlines()[1:]]
    column = {name.strip(): i for i, name in enumerate(header)}
    root, children = rows[0], rows[1:]
    for name, hand in (("params", HAND["lenet"]["params"]), ("MACs", HAND["lenet"]["macs"])):
        assert int(root[column[name]]) == hand
        assert sum(int(row[column[name]]) for row in children) == hand
    assert [int(row[column["MACs"]]) for row in children] == list(
        HAND["lenet"]["macs_by_module"].values())


def test_depth_limits_the_tree_and_the_per_depth_views(reports):
    assert len(flops_report(reports["lenet"], view="tree", depth=0).splitlines()) == 4  # title,
    # header, rule and the root
    tree = flops_report(reports["blocks"], view="tree", depth=1)
    assert "(blocks): ModuleList" in tree and "Block x 3" not in tree
    top = flops_report(reports["blocks"], view="top", depth=1, top=-1)
    assert [line.split()[0] for line in top.splitlines()[3:] if line[:7].strip()] == ["0", "1"]


def test_top_takes_minus_one_for_all_and_groups_by_type_or_path(reports):
    every = flops_report(reports["blocks"], view="top", top=-1, depth=1)
    # depth 1 holds a ModuleList, two Linears (up, head) and a Block: three types.
    assert "Block: 272" in every and "ModuleList: 216" in every and "Linear: 161" in every
    one = flops_report(reports["blocks"], view="top", top=1, depth=1)
    assert "Linear" not in one and "Block: 272" in one  # the wide block: 16*16 + 16 params
    by_path = flops_report(reports["blocks"], view="top", top=2, depth=1, group_by="path")
    assert "wide: 272" in by_path and "blocks: 216" in by_path and "head" not in by_path


def test_ignore_modules_leaves_types_out_of_the_views_but_not_the_totals(reports):
    tree = flops_report(reports["lenet"], view="tree", ignore_modules=["Linear"])
    assert "(fc1)" not in tree and "(conv1): Conv2d" in tree
    assert "416.52 kMACs" in tree  # the root still holds every MAC
    top = flops_report(reports["lenet"], view="top",
                       ignore_modules=["torch.nn.modules.conv.Conv2d"])
    assert "Conv2d" not in top and "Linear: 58.92 kMACs" in top
    by_op = flops_report(reports["lenet"], view="module_operators", ignore_modules=["Linear"])
    assert "\nfc1" not in by_op and "\nconv1" in by_op


def test_tablefmt_is_passed_to_tabulate(reports):
    lines = flops_report(reports["mlp"], view="operators", tablefmt="github").splitlines()
    assert all(line.startswith("|") for line in lines[1:])


def test_rendering_returns_its_text_and_prints_or_writes_nothing(reports, tmp_path, capsys):
    text = flops_report(reports["mlp"], view="summary")
    assert text.startswith("Summary of") and capsys.readouterr().out == ""
    with pytest.raises(TypeError, match="unknown keyword.*output_file"):
        flops_report(reports["mlp"], view="summary", output_file=tmp_path / "report.txt")


def test_unknown_view_and_grouping_are_refused_with_the_choices(reports):
    with pytest.raises(ValueError, match="unknown view 'graph'; choose from summary, top"):
        flops_report(reports["mlp"], view="graph")
    with pytest.raises(ValueError, match="group_by must be 'type' or 'path'"):
        flops_report(reports["mlp"], view="top", group_by="class")


@pytest.mark.parametrize("which", ["forward", "train", "dynamic", "timed"])
def test_json_reloads_into_an_equal_report_that_renders_the_same(reports, train_mlp, dynamic_mlp,
                                                                   timed_mlp, which):
    report = {"forward": reports["lenet"], "train": train_mlp, "dynamic": dynamic_mlp,
              "timed": timed_mlp}[which]
    reloaded = Report.model_validate_json(report.model_dump_json())
    assert reloaded == report
    assert flops_report(reloaded, view=VIEWS) == flops_report(report, view=VIEWS)


def rows_of(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("model", ["mlp", "lenet", "blocks"])
def test_csv_rows_per_op_and_per_module_sum_to_the_totals(reports, model):
    report, hand = reports[model], HAND[model]
    by_op = rows_of(to_csv(report, rows="operators"))
    by_module = rows_of(to_csv(report, rows="modules"))
    for field, total in (("flops", hand["flops"]), ("macs", hand["macs"])):
        assert sum(int(row[field]) for row in by_op) == total
        # Every node is in exactly one module's exclusive count.
        assert sum(int(row[f"exclusive_{field}"]) for row in by_module) == total
        assert int(by_module[0][f"inclusive_{field}"]) == total  # the root row
    assert {row["path"]: int(row["inclusive_macs"]) for row in by_module
            if row["path"] in hand["macs_by_module"]} == hand["macs_by_module"]


def test_csv_of_a_train_report_sums_to_its_total_and_timed_rows_carry_seconds(train_mlp,
                                                                              timed_mlp):
    by_module = rows_of(to_csv(train_mlp))
    assert sum(int(row["exclusive_flops"]) for row in by_module) == 22_056 + 27_176
    timed = {row["path"]: row for row in rows_of(to_csv(timed_mlp))}
    assert float(timed["fc1"]["inclusive_s"]) == 0.002 and float(timed[""]["inclusive_s"]) == 0.004


# --- printed totals ----------------------------------------------------------------------------

def tsv_table(text: str) -> tuple[dict[str, int], list[list[str]]]:
    """Column index by header name, and the stripped cells of each row, of one view rendered
    with ``tablefmt="tsv"`` (the first line is the title); tsv leaves out trailing empty cells,
    which are put back as ``""``."""
    header, *rows = [[cell.strip() for cell in line.split("\t")]
                     for line in text.splitlines()[1:]]
    return ({name: i for i, name in enumerate(header)},
            [row + [""] * (len(header) - len(row)) for row in rows])


# The totals each case's report must print: HAND's, and for the train MLP forward + backward
# from test_train_mode_shows_forward_backward_and_their_ratio (22,056 + 27,176 FLOPs,
# 10,752 + 13,312 MACs, bytes 22,280 read and 15,304 written).
PRINTED_TOTALS = {
    "mlp": {"FLOPs": 22_056, "MACs": 10_752, "bytes read": 13_608, "bytes written": 2_208},
    "lenet": {"FLOPs": 850_794, "MACs": 416_520, "bytes read": 309_288, "bytes written": 58_408},
    "blocks": {"FLOPs": 2_642, "MACs": 1_184},
    "train": {"FLOPs": 22_056 + 27_176, "MACs": 10_752 + 13_312, "bytes read": 22_280,
              "bytes written": 15_304},
}


def report_of(case: str, reports: dict[str, Report], train_mlp: Report) -> Report:
    return train_mlp if case == "train" else reports[case]


@pytest.mark.parametrize("case", list(PRINTED_TOTALS))
def test_operator_rows_sum_to_the_printed_total_row_and_the_hand_totals(reports, train_mlp,
                                                                         case):
    """torchinfo's check on the view with a total row: each cost column of the op rows, read back
    from the printed table, sums to the total row, which holds the hand-derived totals; the
    calls sum to the total's (19 nodes for the train MLP, see its test) and the shares to 100%."""
    text = flops_report(report_of(case, reports, train_mlp), view="operators", as_string=False,
                        tablefmt="tsv")
    column, rows = tsv_table(text)
    *ops, total = rows
    assert total[0] == "total"
    for name, hand in PRINTED_TOTALS[case].items():
        assert sum(int(row[column[name]]) for row in ops) == int(total[column[name]]) == hand
    assert sum(int(row[column["calls"]]) for row in ops) == int(total[column["calls"]])
    if case == "train":
        assert int(total[column["calls"]]) == 19
    for share in ("% FLOPs", "% MACs"):
        assert float(total[column[share]]) == 100.0
        # each share is rounded to 0.01, so n of them are off by at most n * 0.005
        assert abs(sum(float(row[column[share]]) for row in ops) - 100) <= 0.005 * len(ops)


@pytest.mark.parametrize("case", list(PRINTED_TOTALS))
def test_the_roots_ops_in_module_operators_sum_to_the_hand_totals(reports, train_mlp, case):
    """The root's block (its first row and the unnamed rows under it) lists every op with a
    cost; its cost columns sum to the model's totals."""
    column, rows = tsv_table(flops_report(report_of(case, reports, train_mlp),
                                          view="module_operators", as_string=False,
                                          tablefmt="tsv"))
    next_module = next(i for i, row in enumerate(rows[1:] + [["end"]], 1) if row[0])
    root = rows[:next_module]
    for name, hand in PRINTED_TOTALS[case].items():
        assert sum(int(row[column[name]]) for row in root) == hand


# --- options -----------------------------------------------------------------------------------

def test_keywords_and_a_render_options_value_render_the_same(reports):
    report = reports["blocks"]
    keywords = flops_report(report, view=["tree", "top"], depth=1, top=-1, group_by="path",
                            collapse=False, ignore_modules=["Linear"])
    options = RenderOptions(view=("tree", "top"), depth=1, top=-1, group_by="path",
                            collapse=False, ignore_modules=("Linear",))
    assert flops_report(report, options) == keywords
    # a keyword overrides the same field of the options
    assert flops_report(report, options, view="operators") == flops_report(report,
                                                                           view="operators")
    assert to_markdown(report, options) == to_markdown(report, view=["tree", "top"], depth=1,
                                                       top=-1, group_by="path", collapse=False,
                                                       ignore_modules=["Linear"])


def test_every_render_option_has_a_description():
    assert all(field.description for field in RenderOptions.model_fields.values())


@pytest.mark.parametrize("call", [flops_report, to_markdown], ids=["flops_report", "to_markdown"])
def test_an_unknown_keyword_is_a_type_error_naming_the_valid_ones(reports, call):
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) colapse; it takes view, depth, "
                                        r"top, group_by, collapse"):
        call(reports["mlp"], colapse=False)


@pytest.mark.parametrize("call", [flops_report, to_markdown, to_csv],
                         ids=["flops_report", "to_markdown", "to_csv"])
def test_a_model_instead_of_its_report_is_refused_with_the_call_that_makes_one(call):
    with pytest.raises(TypeError, match=r"renders a Report, not a TwoLayerMLP: pass the report "
                                        r"of exportflops\.analyze\(model, args\)"):
        call(TwoLayerMLP())


@pytest.mark.parametrize("keywords, message", [
    ({"depth": -2}, "greater than or equal to -1"),
    ({"top": -3}, "greater than or equal to -1"),
    ({"tablefmt": "tsv"}, "to_markdown writes GitHub tables, not tablefmt='tsv'"),
], ids=["depth", "top", "markdown-tablefmt"])
def test_out_of_range_options_are_refused(reports, keywords, message):
    with pytest.raises(ValueError, match=message):
        to_markdown(reports["mlp"], **keywords)


# --- an uncounted op in the tree ---------------------------------------------------------------

class UncountedThenLinear(nn.Module):
    def __init__(self, uncounted):
        super().__init__()
        self.a = uncounted.model(8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):  # (2, 8)
        return self.b(self.a(x))


def test_an_uncounted_op_shows_in_the_functionals_of_the_module_that_ran_it_only(uncounted):
    report = analyze(UncountedThenLinear(uncounted), (torch.randn(2, 8),))
    assert [(u.op, u.modules) for u in report.uncounted] == [(uncounted.name, ["a"])]
    column, rows = tsv_table(flops_report(report, view="tree", tablefmt="tsv"))
    functionals = {row[0]: row[column["functionals"]] for row in rows}
    assert functionals == {"UncountedThenLinear": "",
                           "(a): LinearThenDoubled": "exportflops_tests.doubled: uncounted",
                           "(fc): Linear": "", "(b): Linear": ""}
