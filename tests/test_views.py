"""flops_report views as golden text, on two models whose counts are derived by hand here.

TwoLayerMLP(32, 64, 10) on (4, 32):
  fc1 4*32*64 = 8,192 MACs, bias 4*64 = 256; act ReLU 256; fc2 4*64*10 = 2,560 MACs, bias 40.
  MACs 10,752; FLOPs 2*10,752 + 256 + 256 + 40 = 22,056. Params 32*64+64 + 64*10+10 = 2,762.
LeNet-5 on (1, 1, 32, 32):
  conv1 1->6, 5x5 -> 6x28x28: 6*28*28 * 1*5*5 = 117,600 MACs; pool -> 6x14x14
  conv2 6->16, 5x5 -> 16x10x10: 16*10*10 * 6*5*5 = 240,000 MACs; pool -> 16x5x5
  fc1 400->120 48,000; fc2 120->84 10,080; fc3 84->10 840. MACs 416,520.
  Params: 156 + 2,416 + 48,120 + 10,164 + 850 = 61,706.
The goldens in tests/goldens/ were read and their numbers checked against these derivations
(the tests below also assert them); regenerate one only after reading the diff:
``EXPORTFLOPS_REGOLD=1 python -m pytest tests/test_views.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exportflops import Report, analyze, flops_report, to_csv
from models import TwoLayerMLP

GOLDENS = Path(__file__).parent / "goldens"


class LeNet5(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


HAND = {
    "mlp": {"macs": 10_752, "flops": 22_056, "params": 2_762,
            "modules": {"fc1": 8_192, "fc2": 2_560, "act": 0}},
    "lenet": {"macs": 416_520, "params": 61_706,
              "modules": {"conv1": 117_600, "conv2": 240_000, "fc1": 48_000, "fc2": 10_080,
                          "fc3": 840}},
}


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {"mlp": analyze(TwoLayerMLP(), (torch.randn(4, 32),)),
            "lenet": analyze(LeNet5(), (torch.randn(1, 1, 32, 32),))}


@pytest.mark.parametrize("model", list(HAND))
def test_counts_behind_the_goldens_equal_the_hand_derivation(reports, model):
    report, hand = reports[model], HAND[model]
    assert report.total.macs == hand["macs"] and report.params == hand["params"]
    assert report.total.flops == hand.get("flops", report.total.flops)
    assert {p: report.module(p).inclusive.macs for p in hand["modules"]} == hand["modules"]


VIEWS = ["summary", "top", "tree", "operators", "module_operators"]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", list(HAND))
def test_view_matches_its_golden(reports, model, view):
    text = flops_report(reports[model], view=view)
    # The versions line changes with every release; the golden keeps a placeholder.
    text = "\n".join("versions  <torch and exportflops versions>" if line.startswith("versions")
                     else line for line in text.splitlines()) + "\n"
    golden = GOLDENS / f"{model}_{view}.txt"
    if os.environ.get("EXPORTFLOPS_REGOLD"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_raw_integers_with_as_string_false(reports):
    text = flops_report(reports["lenet"], view="summary", as_string=False)
    assert "416520" in text and "61706" in text


def test_depth_and_ignore_modules_limit_the_tree(reports):
    tree = flops_report(reports["lenet"], view="tree", depth=0)
    assert len(tree.splitlines()) == 4  # title, header, rule, the root
    no_linear = flops_report(reports["lenet"], view="tree", ignore_modules=["Linear"])
    assert "(fc1)" not in no_linear and "(conv1)" in no_linear


def test_json_reloads_equal_and_csv_sums_to_the_totals(reports):
    report = reports["lenet"]
    assert Report.model_validate_json(report.model_dump_json()) == report
    operators = to_csv(report, rows="operators").splitlines()[1:]
    flops_column = to_csv(report, rows="operators").splitlines()[0].split(",").index("flops")
    assert sum(int(row.split(",")[flops_column]) for row in operators) == report.total.flops


def test_output_file_and_print(reports, tmp_path, capsys):
    path = tmp_path / "report.txt"
    text = flops_report(reports["mlp"], view="summary", output_file=path, print_output=True)
    assert path.read_text() == text and capsys.readouterr().out == text
