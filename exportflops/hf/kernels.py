"""Pooling layers a config sized to nothing, named when the model is built: torch's own error
comes only at the forward ("stride should not be zero"), with no module and no config field.

Any pooling module whose kernel or stride is 0 is refused, naming its path and sizes. Where the
module that holds it is one whose arithmetic from its config is known, a rule registered here
by that module's class name says which config fields give the kernel, their values and values
that work (`pool_rule`); a family whose derivation is not known yet is named by its path alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import BuildError

#: The class name of a module holding a pooling layer -> how its config sizes that layer's
#: kernel: the fields, their values and the values that work.
POOL_RULES: dict[str, Callable[[Any], str]] = {}


def pool_rule(holder: str) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Decorator: the rule that says how the config of ``holder`` (a module class name) sizes
    the kernel of the pooling layer it holds."""
    def register(rule: Callable[[Any], str]) -> Callable[[Any], str]:
        if holder in POOL_RULES:
            raise ValueError(f"{holder} already has the pool rule {POOL_RULES[holder].__name__}")
        POOL_RULES[holder] = rule
        return rule
    return register


@pool_rule("Gemma3MultiModalProjector")
def _gemma3(config) -> str:
    # transformers' Gemma3MultiModalProjector.__init__: patches_per_image = image_size //
    # patch_size, tokens_per_side = mm_tokens_per_image ** 0.5, kernel_size = patches_per_image
    # // tokens_per_side. The default vision config is SigLIP's (224, 16); Gemma 3's checkpoints
    # pool 896 / 14 = 64 patches a side to 16 (Gemma 3 Technical Report, arXiv:2503.19786, 2.1:
    # 896 x 896 images, 256 tokens; google/gemma-3-4b-it config.json).
    vision = config.vision_config
    patches = vision.image_size // vision.patch_size
    side = int(config.mm_tokens_per_image ** 0.5)
    return (f"its kernel is vision_config.image_size // vision_config.patch_size "
            f"({vision.image_size} // {vision.patch_size} = {patches} patches a side) // "
            f"sqrt(mm_tokens_per_image) ({config.mm_tokens_per_image}: {side} tokens a side) = "
            f"{patches // side}. Give a config whose vision_config.image_size is "
            f"vision_config.patch_size x {side} x k, each token pooling k x k patches "
            f"({vision.patch_size * side} for k = 1; Gemma 3's checkpoints: 896 = 14 x 16 x 4, "
            f"with patch_size 14), as hf:path/to/config.json or hf:org/name of a checkpoint in "
            f"the local cache")


def check_pools(model) -> None:
    """Raise `BuildError` for the first pooling layer of ``model`` whose kernel or stride is
    0, naming it and (`POOL_RULES`) the config fields that sized it."""
    import torch

    pools = (torch.nn.modules.pooling._AvgPoolNd, torch.nn.modules.pooling._MaxPoolNd,
             torch.nn.modules.pooling._LPPoolNd)
    for path, module in model.named_modules():
        if not isinstance(module, pools):
            continue
        sizes = {name: getattr(module, name, None) for name in ("kernel_size", "stride")}
        if not any(0 in _tuple(value) for value in sizes.values()):
            continue
        holder = model.get_submodule(path.rpartition(".")[0])
        rule = POOL_RULES.get(type(holder).__name__)
        config = getattr(holder, "config", None)
        config = model.config if config is None else config
        why = (rule(config) if rule is not None else
               "the config's sizes give it no window: check the fields its holder "
               f"{type(holder).__name__} reads to size it")
        shown = ", ".join(f"{name}={value}" for name, value in sizes.items())
        raise BuildError(f"{config.model_type}'s config builds {path} "
                         f"({type(module).__name__}) with {shown}, a pooling that torch "
                         f"refuses at the forward (\"stride should not be zero\"): {why}.")


def _tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
