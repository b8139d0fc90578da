"""What ``hf:`` does before the count, and no more: it imports the one model family it builds
(transformers' top level exports every family's classes, some 2,500, and imports each on first
access: a search through them all cost some 15 s), and builds a twin to probe the inputs on
only where the model is deep enough for the twin to save time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

# What a fresh interpreter imports while building each model type: the family's modeling
# modules that were not loaded before it.
_CHILD = """
import json, sys
import torch, transformers
from exportflops.hf.models import hf_model

new = {}
for model_type in sys.argv[1:]:
    before = set(sys.modules)
    hf_model(model_type, torch.device("meta"), None, layers=1)
    new[model_type] = sorted(m for m in set(sys.modules) - before
                             if m.startswith("transformers.models.") and ".modeling_" in m)
print(json.dumps(new))
"""

# Each type's family, the folder transformers keeps it in; both classes come from the auto
# tables (AutoModelForCausalLM's, AutoModel's for CLIP's text tower).
FAMILIES = {"llama": "llama", "clip_text_model": "clip"}


def test_building_a_model_type_imports_its_own_family_and_no_other():
    child = subprocess.run([sys.executable, "-c", _CHILD, *FAMILIES], capture_output=True,
                           text=True, timeout=300, check=True)
    imported = json.loads(child.stdout.strip().splitlines()[-1])
    auto = "transformers.models.auto.modeling_auto"
    assert {model_type: [m for m in modules if m != auto]
            for model_type, modules in imported.items()} == {
        model_type: [f"transformers.models.{family}.modeling_{family}"]
        for model_type, family in FAMILIES.items()}


@pytest.mark.parametrize(("layers", "builds"), [(2, 1), (None, 2)], ids=["2 layers", "12"])
def test_a_shallow_model_is_probed_itself_and_a_deep_one_through_a_twin(
        monkeypatch, layers, builds):
    """GPT-2's default config holds 12 layers, past PROBE_TWIN_PAST (8): its inputs are found
    on a twin one layer deep, built beside it; at 2 layers a twin would cost more than the
    layer it saves, and the model is built once."""
    import torch

    import exportflops.hf.models as hf_models

    built = []

    def build(config, *args, **kwargs):
        built.append(config.n_layer)
        return builder(config, *args, **kwargs)

    builder = hf_models.build
    monkeypatch.setattr(hf_models, "build", build)
    hf_models.hf_model("gpt2", torch.device("meta"), None, layers=layers)
    assert built == [layers or 12, 1][:builds]


def test_the_auto_tables_hold_every_auto_model_class_transformers_exports():
    """The tables are read from modeling_auto alone: a transformers that defined an auto class
    elsewhere would leave its table out."""
    import transformers

    from exportflops.hf.models import _auto_tables

    exported = {name for name in dir(transformers) if name.startswith("AutoModel")}
    assert set(_auto_tables(transformers)) == exported
