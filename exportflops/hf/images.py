"""Image inputs in the layouts one family's vision tower reads, each sized by the config fields
its code reads: SegGPT's prompt, a windowed ViT's patch states, patches as rows, as images, as
clips or as blocks of merged tokens, Aria's images of its projector's patch counts, Gemma 4's
pooled grid, VideoLLaMA 3's merge sizes, Molmo2's pooled crops; and an image's placeholders in
the text (`image_placeholders`). The family inputs are rules of the registry (`rules`);
`image_companions` is what `companions` asks. None (or empty) where the config has no such
field, as in `tasks`."""

from __future__ import annotations

import math
from typing import Any

from ..errors import UsageError
from .media import (
    GRID_INPUTS, IMAGE_TOKEN, MAX_POSITIONS, MERGE_SIZES, config_int, image_size, merge_size,
    patch_grid, sub_config, with_image_tokens,
)
from .parent import parent_configs
from .rules import Wanted, input_rule
from .sizes import windows

#: SegGPT's prompt: an image and its mask, each stacked above the input image (the model
#: concatenates them along the height) to fill the config's image_size.
PROMPT_IMAGES = ("prompt_pixel_values", "prompt_masks")


@input_rule(*PROMPT_IMAGES)
def prompt_image(wanted: Wanted):
    """SegGPT's prompt image (or mask) ``(batch, num_channels, height / 2, width)``: its
    image_size (896, 448) is a prompt above an input, concatenated along the height by its
    forward. None where image_size is not such a pair."""
    config = wanted.config
    size = getattr(config, "image_size", None)
    if not (isinstance(size, (list, tuple)) and len(size) == 2):
        return None
    return wanted.zeros((wanted.batch, config.num_channels, size[0] // 2, size[1]))


def windowed_states(config, device, *, batch: int):
    """The patch states a windowed ViT encoder (LW-DETR's, RF-DETR's DINOv2) reads, cut into
    windows by its embeddings: ``(batch * windows, patches / windows, hidden_size)``, each
    image's image_size / patch_size patches a side. Its layers fold the windows back into the
    batch by all its `windows` (LW-DETR's num_windows, RF-DETR's num_windows squared). None
    where the config has no num_windows."""
    import torch

    cut, patch = windows(config), config_int(config, ("patch_size",))
    if cut is None or patch is None:
        return None
    count = cut[1]
    height, width = image_size(config)
    patches = (height // patch) * (width // patch)
    return torch.zeros((batch * count, patches // count, config.hidden_size), device=device)


def patch_rows(model, vision, device, *, batch: int) -> list:
    """Images as rows of flattened patches ``(batch, patches, num_channels * patch_size ** 2)``,
    image_size / patch_size patches a side, to choose from last: what a tower whose patch
    embedding is a linear layer over flattened patches reads (Molmo2's). Empty where
    ``vision`` has no int patch_size or no linear layer of ``model`` reads such a row."""
    import torch

    grid = _patch_rows(vision)
    if grid is None or not any(isinstance(m, torch.nn.Linear) and m.in_features == grid[2]
                               for m in model.modules()):
        return []
    down, across, row = grid
    return [torch.zeros((batch, down * across, row), device=device)]


def _patch_rows(vision) -> tuple[int, int, int] | None:
    """One image of ``vision``'s image_size as rows of flattened patches: its patches down and
    across, and num_channels * patch_size ** 2 values a row; None where patch_size is no
    int."""
    patch = config_int(vision, ("patch_size",))
    if patch is None:
        return None
    height, width = image_size(vision)
    channels = config_int(vision, ("num_channels",)) or 3
    return height // patch, width // patch, channels * patch * patch


def patch_layouts(flat, vision):
    """Qwen2-VL's flattened patches ``flat`` ``(patches, channels * patch_size ** 2)``, and, to
    choose from (`hf_media.accepted`), each patch as an image ``(patches, channels,
    patch_size, patch_size)``: Kimi-K2.5's vision tower convolves each (a Conv2d of kernel and
    stride patch_size); and those images as one batch ``(1, patches, channels, patch_size,
    patch_size)``, as PaddleOCR-VL's model passes them to its tower (``unsqueeze(0)``). ``flat``
    alone where the vision config has a temporal_patch_size (a patch of several frames,
    flattened: Qwen2-VL's Conv3d reshapes the rows itself)."""
    patch = config_int(vision, ("patch_size",))
    if config_int(vision, ("temporal_patch_size",)) is not None or patch is None:
        return flat
    images = flat.view(flat.shape[0], -1, patch, patch)
    return [flat, images, images.unsqueeze(0)]


#: Patches a side that Molmo2's image processor pools into one image token (its pooling_size
#: default, [2, 2]): a setting of the processor, which the model's config does not keep.
POOLING = 2


def pooled_crops(vision, device, *, batch: int) -> tuple[dict, int] | None:
    """Molmo2's image inputs, as its processor cuts one image of image_size for each example:
    two crops, the whole image at low resolution and its one high-resolution tile (the same
    patches at this size), each rows of flattened patches ``(crops, patches, num_channels *
    patch_size ** 2)``; which patches each image token pools, ``image_token_pooling`` ``(tokens,
    POOLING ** 2)``, indices into all the rows, -1 past the grid's edge; each image's token
    grid of each crop ``image_grids`` ``(batch, 4)``; ``image_num_crops``; and the tokens one
    image becomes. None where ``vision`` has no int patch_size."""
    import torch

    grid = _patch_rows(vision)
    if grid is None:
        return None
    down, across, row = grid  # patches a side, values a patch
    rows, cols = -(-down // POOLING), -(-across // POOLING)  # tokens a side
    # The grid padded with -1 to whole cells below and right, each cell's patches row by row.
    padded = torch.full((rows * POOLING, cols * POOLING), -1)
    padded[:down, :across] = torch.arange(down * across).view(down, across)
    crop = padded.view(rows, POOLING, cols, POOLING).permute(0, 2, 1, 3).reshape(-1, POOLING ** 2)
    crops = 2
    pooling = torch.cat([torch.where(crop >= 0, crop + (image * crops + c) * down * across, -1)
                         for image in range(batch) for c in range(crops)])
    return {
        "pixel_values": torch.zeros((batch * crops, down * across, row), device=device),
        "image_token_pooling": pooling.to(device=device, dtype=torch.int32),
        # The low-resolution crop's token grid, then the tiles': the same at this size.
        "image_grids": torch.tensor([[rows, cols, rows, cols]] * batch, device=device),
        "image_num_crops": torch.full((batch,), crops, device=device),
    }, crops * rows * cols


def image_placeholders(inputs: dict[str, Any], parameters: set[str], config, count: int,
                       seq: int | None) -> None:
    """``count`` image placeholders (image_token_id) in the tokens, and in mm_token_type_ids."""
    import torch

    token = config_int(config, IMAGE_TOKEN)
    if "input_ids" not in inputs or token is None:
        return
    inputs |= _room_for_image(inputs, config, count, seq)
    if count <= inputs["input_ids"].shape[1]:
        inputs["input_ids"] = with_image_tokens(inputs["input_ids"], token, count)
        if "mm_token_type_ids" in parameters:
            kinds = torch.zeros_like(inputs["input_ids"], dtype=torch.int)
            inputs["mm_token_type_ids"] = with_image_tokens(kinds, 1, count)


def _room_for_image(inputs: dict[str, Any], config, count: int, seq: int | None
                    ) -> dict[str, Any]:
    """The text of ``inputs`` (its ids, token types and mask of ones) lengthened to hold an
    image's ``count`` tokens before its own, where the image has more tokens than the default
    text (MiniMax-M3-VL's image_size 2016 in patches of 14, merged 2 x 2: 72 x 72 = 5184) and
    the text model's positions hold both. Empty where the text already holds them; a
    UsageError where ``seq`` set a text too short for them."""
    ids = inputs["input_ids"]
    limit = config_int(config.get_text_config(), MAX_POSITIONS)
    length = count + ids.shape[1]
    if count <= ids.shape[1] or (limit is not None and length > limit):
        return {}
    if seq is not None:
        raise UsageError(f"seq={seq}: one image of {type(config).__name__} takes {count} "
                         f"tokens of the text; pass seq={count} or more.")
    shape = (ids.shape[0], length)
    return {name: ids.new_ones(shape) if name == "attention_mask" else ids.new_zeros(shape)
            for name in ("input_ids", "token_type_ids", "attention_mask") if name in inputs}


def projector_images(config, ids) -> dict:
    """Aria's images, for the tokens ``ids``: its projector looks its queries up by an image's
    patch count (projector_patch_to_query_dict, 1225: 128 and 4900: 256 by default), so each
    image is the fewest patches it takes, a square of isqrt(1225) = 35 patches of the vision
    tower's patch_size a side (its embeddings bucket any grid onto their positions); and in the
    tokens, one placeholder (image_token_index) per query. Empty where the config has no such
    table or its patch counts are no square."""
    import torch

    table, vision = getattr(config, "projector_patch_to_query_dict", None), sub_config(config,
                                                                                     "vision")
    token, patch = config_int(config, IMAGE_TOKEN), config_int(vision, ("patch_size",))
    if not isinstance(table, dict) or not table or None in (token, patch):
        return {}
    count = min(table)
    side = math.isqrt(count)
    if side * side != count or table[count] > ids.shape[1]:
        return {}
    channels = config_int(vision, ("num_channels",)) or 3
    images = torch.zeros((ids.shape[0], channels, side * patch, side * patch), device=ids.device)
    return {"pixel_values": images, "input_ids": with_image_tokens(ids, token, table[count])}


def pooled_patches(vision) -> int | None:
    """Patches a side of one image of Gemma 4's vision tower, which pools pooling_kernel_size x
    pooling_kernel_size patches into one token: its image_size (224 where it names none) over
    patch_size, rounded down to a multiple of pooling_kernel_size, as its processor sizes an
    image (224 / 16 = 14, so 12 a side, 16 tokens). None where the config does not pool so, or
    keeps no position_embedding_size: a tower that pools patches but reads no position per
    patch takes whole images, not these."""
    pool, patch = (config_int(vision, (field,)) for field in ("pooling_kernel_size", "patch_size"))
    if pool is None or patch is None or not hasattr(vision, "position_embedding_size"):
        return None
    return image_size(vision)[0] // patch // pool * pool


def patch_cubes(vision, image) -> list:
    """Each example's image (``image``, ``(batch, channels, height, width)``) as Inkling's
    processor cuts it: `patch_grid`'s patches of every example in one row, each a clip of
    temporal_patch_size frames (a still image repeated), channels last ``(patches,
    temporal_patch_size, patch_size, patch_size, channels)``, which its vision tower folds into
    one token each; a layout to choose from, for a forward that takes no patch grid. Empty
    where the vision config has no temporal_patch_size."""
    import torch

    depth, patch = (config_int(vision, (field,)) for field in ("temporal_patch_size",
                                                               "patch_size"))
    if depth is None or patch is None:
        return []
    _, h, w = patch_grid(vision)
    count = image.shape[0] * h * w
    return [torch.zeros((count, depth, patch, patch, image.shape[1]), device=image.device)]


def token_blocks(vision, device, *, batch: int) -> tuple | None:
    """Inkling 2's image inputs, to try where Qwen2-VL's patch grid fails: each token's merge x
    merge patches as one block of pixels, channels last ``(tokens, merge * patch_size, merge *
    patch_size, num_channels)``, and the grid counted in those tokens ``(batch, 3)``: the
    `patch_grid` over spatial_merge_size a side. None where the config merges no patches."""
    import torch

    merge, patch = (config_int(vision, (field,)) for field in ("spatial_merge_size",
                                                               "patch_size"))
    if merge is None or merge < 2 or patch is None:
        return None
    t, h, w = patch_grid(vision)
    rows = [t, h // merge, w // merge]
    side, channels = merge * patch, config_int(vision, ("num_channels",)) or 3
    blocks = torch.zeros((batch * math.prod(rows), side, side, channels), device=device)
    return blocks, torch.tensor([rows] * batch, dtype=torch.long, device=device)


@input_rule("hidden_states")
def windowed_patch_states(wanted: Wanted):
    """A windowed ViT's patch states (`windowed_states`)."""
    return windowed_states(wanted.config, wanted.device, batch=wanted.batch)


@input_rule(*MERGE_SIZES)
def merge_sizes(wanted: Wanted):
    """VideoLLaMA3's (and its tower's) merge of each image's patches, a side: the vision
    config's `merge_size` where it keeps one, else 1, VideoLLaMA3's image processor's for a
    still image (its video processor merges 2)."""
    import torch

    merge = merge_size(sub_config(wanted.config, "vision"))
    return torch.full((wanted.batch,), merge, dtype=torch.long, device=wanted.device)


@input_rule("pixel_position_ids")
def pooled_positions(wanted: Wanted):
    """Gemma 4's (x, y) of each patch of its `pooled_patches` grid: zeros, every patch a real
    one (-1 marks padding)."""
    import torch

    side = pooled_patches(wanted.config)
    return None if side is None else wanted.zeros((wanted.batch, side ** 2, 2), torch.long)


@input_rule("num_patches", "inputs_embeds")
def ocr_sequence(wanted: Wanted):
    """DeepSeek-OCR2's vision encoder's patches and queries (`patches_then_queries`)."""
    return patches_then_queries(wanted.name, wanted.config, wanted.device, batch=wanted.batch)


#: DeepSeek-OCR2's learnt queries, appended to an image's patches: 144 (12 x 12, for a 768-px
#: image) for at most 144 patches, else 256 (16 x 16, for 1024 px), as its modeling code picks
#: between its two query tables.
OCR_QUERIES_768, OCR_QUERIES_1024 = 144, 256


def patches_then_queries(name: str, config, device, *, batch: int):
    """DeepSeek-OCR2's vision encoder's sequence as the vision model holding it builds one:
    the patches of its SAM tower at the tower's image_size (a side of image_size / patch_size,
    halved, rounded up, by each of the neck's downsample_channels convolutions of stride 2
    and padding 1), then the learnt queries (`OCR_QUERIES_768`, `OCR_QUERIES_1024`).
    ``num_patches`` is the patches' count, ``inputs_embeds`` the sequence.
    None where no composite holds ``config`` as its encoder_config beside a sam_config."""
    import torch

    if name not in ("num_patches", "inputs_embeds"):
        return None
    sam = next((parent.sam_config for parent, field in parent_configs(config)
                if field == "encoder_config" and getattr(parent, "sam_config", None) is not None),
               None)
    if sam is None:
        return None
    height, width = (side // sam.patch_size for side in image_size(sam))
    for _ in sam.downsample_channels:
        height, width = -(-height // 2), -(-width // 2)
    patches = height * width
    if name == "num_patches":
        return patches
    queries = OCR_QUERIES_768 if patches <= OCR_QUERIES_768 else OCR_QUERIES_1024
    return torch.zeros((batch, patches + queries, config.hidden_size), device=device)


def image_companions(parameters: set[str], config, inputs: dict, made: dict) -> dict:
    """The image inputs that follow from ``inputs`` (and the others ``made`` so far): Aria's
    images of its projector's patch counts (`projector_images`); Inkling's patches as clips, to
    choose from where forward takes no grid (`patch_cubes`); Gemma 4's patches beside their
    positions, flattened: num_channels x patch_size ** 2 values each."""
    import torch

    found = {}
    if "pixel_values" in inputs and "input_ids" in inputs:
        found |= projector_images(config, inputs["input_ids"])
    images = inputs.get("pixel_values")
    if (isinstance(images, list) and not parameters & set(GRID_INPUTS)
            and "pixel_values" not in made | found):
        cubes = patch_cubes(sub_config(config, "vision"), images[0])
        found |= {"pixel_values": images + cubes} if cubes else {}
    positions = inputs.get("pixel_position_ids")
    if "pixel_values" in inputs and positions is not None and pooled_patches(config):
        patch = config.patch_size
        channels = config_int(config, ("num_channels",)) or 3
        found["pixel_values"] = torch.zeros(positions.shape[:2] + (channels * patch * patch,),
                                            device=positions.device)
    return found
