"""What a notebook shows for each report kind (``_repr_html_``), opened in a real headless
Chromium (tests/browser.py; skipped where there is none): the numbers as the text views write
them, a module tree that opens on a click, no script, no request.

The numbers, by hand:

- `Net` (batch B = 2, float32): embed Linear(8, 16) 2*B*8*16 + B*16 = 544 FLOPs, block.0 and
  block.2 Linear(16, 16) 1056 each, block.1 ReLU B*16 = 32, head Linear(16, 4) 264: 2952 in
  all, written ``2.95 k``; embed's share 544 / 2952 = 18.43%.
- The same model with a dynamic batch: embed's 2*8*16 + 16 = 272 FLOPs per row, ``272*batch``.
- A tiny Llama's decode step (tests/generation/test_generation.py derives it): 34816 MACs that
  do not depend on the context plus 256 per key attended, past + 1 keys: ``256*past + 35072``.
- The roofline of one bias-free Linear(4096, 4096) on 512 rows, float32, on an H100 SXM (NVIDIA's
  datasheet: 67 TFLOP/s float32, 3.35 TB/s): 2*512*4096*4096 = 17179869184 FLOPs take
  17179869184 / 67e12 = 256.42 us; its bytes, x 8 MiB + W 64 MiB read and 8 MiB written,
  83886080 / 3.35e12 = 25.04 us: compute-bound, ``256.42 us``.
- Rank 1 of Megatron's MLP split at TP = 2 (tests/parallel_models.py): one forward all-reduce
  of the B x T x H float32 activations, 2*8*16*4 = 1024 bytes, ``1.02 kB``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.export import Dim

from exportflops import analyze
from exportflops.render.html import CONTENT_SECURITY_POLICY
from tests.browser import Browser, find_chromium

B = 2
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install "
                                                            "chromium; .ci/run does)")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):  # (B, 8) -> (B, 4)
        return self.head(self.block(self.embed(x)))


def _report():
    return analyze(Net(), (torch.randn(B, 8),))


def _dynamic():
    return analyze(Net(), (torch.randn(B, 8),), dynamic_shapes=({0: Dim("batch")},))


def _generation():
    pytest.importorskip("transformers")
    from exportflops import analyze_generation
    from tests.generation.test_generation import BATCH, NEW, PROMPT, _llama

    prompt = torch.zeros(BATCH, PROMPT, dtype=torch.long, device="meta")
    return analyze_generation(_llama(), prompt, new_tokens=NEW)


def _roofline():
    from exportflops.roofline import roofline

    with torch.device("meta"):
        # nested, so that the tree has a module to open: ``0`` holds ``0.0``
        model = nn.Sequential(nn.Sequential(nn.Linear(4096, 4096, bias=False)))
        x = torch.randn(512, 4096)
    return roofline(analyze(model, (x,)), "h100-sxm")


def _rank():
    if not torch.distributed.is_available():
        pytest.skip("torch built without torch.distributed")
    from tests.parallel.test_distributed import _rank_report

    return _rank_report(2, rank=1, mode="forward")


#: kind -> (how to make the record, texts its HTML must show, <details> in its module tree)
KINDS = {
    "report": (_report, ["Summary of Net", "2.95 k", "embed", "FLOPs 544 (18.43%)"], 2),
    "dynamic": (_dynamic, ["272*batch", "size batch"], 2),
    "generation": (_generation, ["256*past + 35072 MACs", "decode, past=5", "prefill"], None),
    "roofline": (_roofline, ["Roofline on h100-sxm", "256.42 us (compute-bound)"], None),
    "rank": (_rank, ["1 of 2", "1.02 kB", "Collectives of rank 1 of 2"], None),
}


@pytest.fixture(scope="module", params=list(KINDS))
def shown(request, tmp_path_factory):
    """One record's ``_repr_html_`` in a page under the HTML report's policy (no request may
    leave it), opened in Chromium; a closed module of its tree is clicked open."""
    if CHROMIUM is None:
        pytest.skip("no chromium")
    make, texts, tree_details = KINDS[request.param]
    fragment = make()._repr_html_()
    path = tmp_path_factory.mktemp("repr") / f"{request.param}.html"
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv="
                    f"'Content-Security-Policy' content=\"{CONTENT_SECURITY_POLICY}\"></head>"
                    f"<body>{fragment}</body></html>")
    with Browser(CHROMIUM) as browser:
        browser.open(path.as_uri())
        closed = "document.querySelector('details:not([open])')"
        seen = SimpleNamespace(
            kind=request.param, fragment=fragment, texts=texts, tree_details=tree_details,
            url=path.as_uri(),
            text=browser.evaluate("document.body.textContent"),
            details=browser.evaluate("document.querySelectorAll('details').length"),
            tree=browser.evaluate("document.querySelectorAll('details details, "
                                  "div.exportflops > details[open]').length"),
            opened=browser.evaluate(f"(function () {{ var d = {closed}; "
                                    f"d.querySelector('summary').click(); return d.open; }})()"),
            scripts=browser.evaluate("document.scripts.length"),
        )
        seen.requests = browser.requested_urls()
        seen.messages = browser.messages()
    return seen


@needs_chromium
def test_the_numbers_are_written_as_the_text_views_write_them(shown):
    for text in shown.texts:
        assert text in shown.text, f"{shown.kind}: {text!r}"


@needs_chromium
def test_a_closed_module_opens_on_a_click(shown):
    assert shown.details >= 2 and shown.opened is True


@needs_chromium
def test_the_tree_has_a_details_per_module_with_children(shown):
    if shown.tree_details is None:
        pytest.skip("counted for Net only")
    # Net's modules with children: the root (open) and block (closed); the root's details is
    # the open one under the report's div, block's the one nested in it.
    assert shown.tree == shown.tree_details


@needs_chromium
def test_no_script_no_request_no_error(shown):
    assert "<script" not in shown.fragment and shown.scripts == 0
    assert [u for u in shown.requests if u != shown.url] == []
    assert shown.url in shown.requests  # the log did record the page's own request
    assert shown.messages == []


def test_special_characters_of_a_name_are_escaped():
    report = _report().model_copy(update={"model": "Net<script>alert(1)</script>"})
    fragment = report._repr_html_()
    assert "<script>" not in fragment and "Net&lt;script&gt;" in fragment
