"""Image sides that a model's config implies where it keeps no plain image_size, and the
rounding of a side to what a model's windows cut whole. Pure arithmetic on config fields."""

from __future__ import annotations


def _int(config, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def vq_image_size(config) -> int | None:
    """A VQ-GAN's images where its config gives the latent grid instead (Janus: num_patches 32
    a side, each encoder stage after the first halving it: 32 x 2^4 = 512)."""
    side, stages = getattr(config, "num_patches", None), getattr(config, "channel_multiplier", None)
    if isinstance(side, int) and isinstance(stages, (list, tuple)) and stages:
        return side * 2 ** (len(stages) - 1)
    return None


def windowed_side(side: int, config) -> int:
    """``side`` pixels rounded down to whole windows of whole patches where ``config`` (or its
    backbone_config) cuts each image into windows: a side holds a multiple of the windows a
    side (num_windows_side where the config keeps it, LW-DETR's; else num_windows, RF-DETR's
    DINOv2, whose 518 pixels of 14-pixel patches are 37 patches, 36 in 4 windows: 504),
    one window at least. ``side`` unchanged elsewhere."""
    windowed = next((c for c in (config, getattr(config, "backbone_config", None))
                     if _int(c, "num_windows") and _int(c, "patch_size")), None)
    if windowed is None:
        return side
    unit = windowed.patch_size * (_int(windowed, "num_windows_side") or windowed.num_windows)
    return max(unit, side // unit * unit)
