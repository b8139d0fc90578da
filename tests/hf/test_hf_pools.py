"""A config that sizes a pooling layer to nothing is refused when the model is built, naming the
layer and the config fields behind its kernel (`exportflops.hf.kernels`), not left to torch's
"stride should not be zero" at the forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exportflops.errors import BuildError
from exportflops.hf.kernels import check_pools
from exportflops.hf.models import blame, hf_model

tf = pytest.importorskip("transformers")
META = torch.device("meta")


def test_gemma3s_default_config_is_refused_naming_the_fields_behind_its_pooling():
    # transformers' default Gemma3Config takes SigLIP's default vision config: 224 // 16 = 14
    # patches a side, pooled to sqrt(256) = 16 tokens a side, a kernel of 14 // 16 = 0.
    with pytest.raises(BuildError) as failed:
        hf_model("gemma3", META, None, layers=1)
    message = str(failed.value)
    assert message.startswith("gemma3's config builds model.multi_modal_projector.avg_pool "
                              "(AvgPool2d) with kernel_size=0, stride=0")
    assert ("vision_config.image_size // vision_config.patch_size (224 // 16 = 14 patches a "
            "side) // sqrt(mm_tokens_per_image) (256: 16 tokens a side) = 0") in message
    # The next step: 16 x 16 = 256 for a kernel of 1, and Gemma 3's own 896 = 14 x 16 x 4.
    assert "vision_config.patch_size x 16 x k" in message and "(256 for k = 1;" in message
    assert blame(failed.value) == "theirs"  # transformers' default config, not our inputs


def test_the_image_size_the_error_suggests_builds_a_pooling_of_kernel_one():
    # 256 // 16 = 16 patches a side pooled to 16 tokens a side: a kernel of 1.
    from transformers import Gemma3Config
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

    config = Gemma3Config()
    config.vision_config.image_size = 256
    with META:
        projector = Gemma3MultiModalProjector(config)
    assert projector.avg_pool.kernel_size == 1


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size=0)


class Unknown(nn.Module):
    """A model whose pooling's derivation from its config no rule knows."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"model_type": "mine"})()
        self.inner = Holder()


def test_a_zero_kernel_of_a_family_no_rule_knows_is_named_by_its_path():
    with pytest.raises(BuildError, match=r"mine's config builds inner\.pool \(MaxPool1d\) with "
                       r"kernel_size=0, stride=0, .*check the fields its holder Holder reads"):
        check_pools(Unknown())
