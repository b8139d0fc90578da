"""``layers=N``: at most N blocks in each stack of a Hugging Face config, and the fields that
point into a stack kept pointing inside it (a layer's index, a backbone's output stages), so
that the capped model builds and runs as the full one does."""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError

#: A layer count's name: num_hidden_layers, n_layer, num_layers, encoder_layers,
#: num_decoder_layers, text_num_hidden_layers, and a named stack's num_hidden_layers
#: (Moonshine's encoder_ and decoder_, ViT-MAE's decoder_, V-JEPA 2's pred_, Gemma 3n's audio
#: conf_, ESMFold2's folding_trunk_), ...
LAYER_COUNT = re.compile(r"((text|vision|audio)_)?(num_|n_)?((hidden|encoder|decoder)_)?layers?"
                         r"|\w+_num_hidden_layers")
#: Fields that count some of a stack's layers: EoMT's and VideoMT's num_blocks (the last layers,
#: which also attend to the queries), Sapiens2's num_last_full_attention_layers.
LAYER_SHARE = re.compile(r"num_blocks|num_last_\w*layers")
#: Fields that index a stack's layers or its hidden states (one per layer, and the embeddings
#: first): DepthPro's intermediate_hook_ids, SAM-style global_attn_indexes, Qwen3-VL's
#: deepstack_visual_indexes, DPT's backbone_out_indices, a composite's vision_feature_layer.
LAYER_INDEX = re.compile(r".*(indices|indexes|hook_ids|feature_layers?)")


def sub_configs(config) -> list:
    """The configs inside a composite config (text, vision, audio, encoder, decoder), deep."""
    found = []
    for value in vars(config).values():
        if hasattr(value, "to_dict") and hasattr(value, "model_type") and value is not config:
            found += [value, *sub_configs(value)]
    return found


def cap_layers(config, layers: int) -> None:
    """At most ``layers`` of each stack in ``config`` and its sub-configs: every integer
    attribute named like a layer count (``num_hidden_layers``, ``n_layer``, ``decoder_layers``,
    ...), the per-layer lists as long as the old count (``layer_types``) cut to match, and the
    indices into the stack that fall outside it moved to its end (`_keep_indices_inside`); a
    stack of stages sized by tuples keeps its stages (`_stages`). A
    backbone whose head reads several of its stages keeps one layer per stage read
    (`_backbone_layers`: Depth Anything's four)."""
    if layers < 1:
        raise UsageError(f"layers={layers}: give a count of at least 1.")
    configs = (config, *sub_configs(config))
    for config_ in configs:
        for name, value in layer_counts(config_).items():
            new = _backbone_layers(config_, value, layers)
            if value <= new or _stages(config_, value):
                continue
            setattr(config_, name, new)
            for other, items in list(vars(config_).items()):
                if isinstance(items, list) and len(items) == value and other != name:
                    setattr(config_, other, items[:new])
                if LAYER_SHARE.fullmatch(other) and _is_int(items) and new < items <= value:
                    setattr(config_, other, new)  # a share of the stack, still inside it
            _cap_backbone(config_, value, new)
            for pointing, prefix in _pointing_into(config_, configs):
                _keep_indices_inside(pointing, value, new, prefix)


def _pointing_into(stack, configs: tuple) -> list[tuple[Any, str]]:
    """The configs among ``configs`` whose index fields may point into ``stack``'s layers, each
    with the prefix such a field's name starts with: ``stack`` itself and a composite that
    holds it (LLaVA's vision_feature_layer), any field; a sibling beside it in a composite,
    only the fields named for it (Molmo2's adapter_config reads vision_config's layers by its
    vision_feature_layer)."""
    found = [(stack, "")]
    for holder in configs:
        keys = [key for key, sub in vars(holder).items() if sub is stack]
        found += [(holder, "")] if keys else []
        found += [(sibling, key.removesuffix("config")) for key in keys if key.endswith("_config")
                  for sibling in vars(holder).values()
                  if sibling is not stack and any(sibling is c for c in configs)]
    return found


def _stages(config, count: int) -> list[str]:
    """The tuples of ``config`` with one entry per layer of a stack ``count`` long: the stages
    of a hierarchical model (Swin's depths and num_heads, Muse Spark's audio hidden_sizes and
    patch_sizes), whose sizes its code reads from those tuples' lengths and last entries (CLAP's
    head reads the last stage's width), so the stack keeps its stages."""
    return [name for name, value in vars(config).items()
            if isinstance(value, tuple) and len(value) == count > 2]


def layer_counts(config) -> dict[str, int]:
    """``config``'s layer counts by name. The stacks of blocks only: num_feat_extract_layers
    (wav2vec2's convolutions) and the like set a model's frame rate, not its depth. A config
    with no such name counts its blocks in ``depth`` (the Qwen-VL and GLM-4V vision towers);
    beside a layer count, ``depth`` is something else (Janus's aligner's)."""
    counts = {name: value for name, value in vars(config).items()
              if _is_int(value) and LAYER_COUNT.fullmatch(name) is not None}
    depth = getattr(config, "depth", None)
    return counts or ({"depth": depth} if _is_int(depth) else {})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _keep_indices_inside(config, old: int, new: int, prefix: str = "") -> None:
    """Each index field of ``config`` (`LAYER_INDEX`) into a stack of ``old`` layers, now
    ``new``: an index past the new end is the last layer (from the end, the first), an
    index inside is left as it is. Some fields count layers from 0 (DepthPro's hooks read
    ``hidden_states[i + 1]``), others hidden states, the embeddings first (LLaVA's
    ``vision_feature_layer``): in both, ``new - 1`` and ``-new`` are inside. The number of
    indices is kept: a head reads as many features as before (VipLLaVA concatenates five).
    Only the fields named from ``prefix`` on."""
    for name, value in list(vars(config).items()):
        if (LAYER_INDEX.fullmatch(name) is None or name == "_out_indices"
                or not name.startswith(prefix)):
            continue  # a backbone's stages: `_cap_backbone`'s
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items or not all(isinstance(i, int) and not isinstance(i, bool) and -old - 1 <= i
                                <= old for i in items):
            continue
        inside = [min(i, new - 1) if i >= 0 else max(i, -new) for i in items]
        if inside != items:
            setattr(config, name, type(value)(inside) if isinstance(value, (list, tuple))
                    else inside[0])


def _backbone_layers(config, old: int, layers: int) -> int:
    """``layers``, or for a backbone (`_stages_read`) at least one layer per stage its head
    reads (Depth Anything's neck reads four)."""
    read = _stages_read(config, old)
    return layers if read is None else max(layers, len(read))


def _stages_read(config, old: int) -> list[int] | None:
    """The stages a backbone config of ``old`` layers outputs (``_out_indices`` into
    ``stage_names``: the stem, then one stage per layer), or None for a config that is no
    such backbone."""
    stages = getattr(config, "stage_names", None)
    read = getattr(config, "_out_indices", None)
    if (isinstance(stages, list) and len(stages) == old + 1 and isinstance(read, list)
            and hasattr(config, "set_output_features_output_indices")):
        return [i if i >= 0 else old + 1 + i for i in read]
    return None


def _cap_backbone(config, old: int, new: int) -> None:
    """A backbone's stages cut to ``new`` layers and its outputs kept inside them: a stage
    past the end is the last, and where that repeats one (which transformers refuses) the
    stages read are the last ones, in order."""
    read = _stages_read(config, old)
    if read is None:
        return
    inside = [min(i, new) for i in read]
    if len(set(inside)) < len(inside):
        inside = list(range(new - len(read) + 1, new + 1))
    config.stage_names = config.stage_names[:new + 1]
    config.set_output_features_output_indices(out_features=None, out_indices=inside)
