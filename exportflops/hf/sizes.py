"""Image sides that a model's config implies where it keeps no plain image_size, and the
rounding of a side to what a model's windows cut whole. Pure arithmetic on config fields."""

from __future__ import annotations


def config_int(config, names: tuple[str, ...]) -> int | None:
    """The first of the fields ``names`` that ``config`` holds as an int (not a bool)."""
    return next((getattr(config, n) for n in names
                 if isinstance(getattr(config, n, None), int)
                 and not isinstance(getattr(config, n), bool)), None)


def depth_positions(config) -> int | None:
    """The positions of a depth decoder (Moshi's, CSM's): it runs across the codebooks of one
    audio frame, a position per codebook with its own embedding and head, so it has
    num_codebooks of them, one fewer than the max_position_embeddings its config keeps. None
    for any other model."""
    if "depth" not in getattr(config, "model_type", ""):
        return None
    return config_int(config, ("num_codebooks",))


def windows(config) -> tuple[int, int] | None:
    """``(windows a side, windows in all)`` of a windowed ViT encoder's config: num_windows
    counts them all where the config also keeps num_windows_side (LW-DETR's), else a side
    (RF-DETR's DINOv2). None where the config has no num_windows."""
    count = config_int(config, ("num_windows",))
    if count is None:
        return None
    side = config_int(config, ("num_windows_side",))
    return (side, count) if side else (count, count ** 2)


def vq_image_size(config) -> int | None:
    """A VQ-GAN's images where its config gives the latent grid instead (Janus: num_patches 32
    a side, each encoder stage after the first halving it: 32 x 2^4 = 512)."""
    side, stages = getattr(config, "num_patches", None), getattr(config, "channel_multiplier", None)
    if isinstance(side, int) and isinstance(stages, (list, tuple)) and stages:
        return side * 2 ** (len(stages) - 1)
    return None


def windowed_side(side: int, config) -> int:
    """``side`` pixels rounded down to whole windows of whole patches where ``config`` (or its
    backbone_config) cuts each image into windows: a side holds a multiple of the `windows` a
    side (RF-DETR's DINOv2: 518 pixels of 14-pixel patches are 37 patches, 36 in 4 windows: 504),
    one window at least. ``side`` unchanged elsewhere."""
    windowed = next((c for c in (config, getattr(config, "backbone_config", None))
                     if windows(c) and config_int(c, ("patch_size",))), None)
    if windowed is None:
        return side
    unit = windowed.patch_size * windows(windowed)[0]
    return max(unit, side // unit * unit)
