"""Inputs that one model family's forward requires, each a rule of the registry (`rules`) sized
by the config field that the model's own code reads for it, and made only where the config has
that field (else None, and `inputs.example` raises its typed error). Zeros, as in `inputs`,
unless a comment says why the forward needs other values."""

from __future__ import annotations

import torch

from .media import config_int, pixels, sub_config
from .parent import modeling_module, parent_configs
from .rules import Wanted, input_rule
from .sizes import depth_positions

#: JEV's decision inputs: per question of the one prompt, the position of its ``<|mark|>``, its
#: number of options and its question type.
DECISION_INPUTS = ("marks", "num_options", "question_type_ids")
#: Regions of an image whose detector features LXMERT reads: the 36 objects per image of the
#: Faster R-CNN features it was pre-trained on (Tan & Bansal 2019, LXMERT).
DETECTOR_BOXES = 36
#: LXMERT's detector inputs and the config field of each one's width.
DETECTOR_FIELDS = {"visual_feats": "visual_feat_dim", "visual_pos": "visual_pos_dim"}
#: The steps of a trajectory an offline-RL transformer reads and the config field of each
#: one's width (a return-to-go, the third, is one number).
TRAJECTORY = {"states": "state_dim", "actions": "act_dim"}
#: The heavy atoms of a glycine (N, CA, C, O): a protein's example is a chain of glycines.
GLYCINE_ATOMS = 4
#: ESMFold2's featurizer pads a complex's atoms to a multiple of this.
ATOM_PADDING = 32
#: ESMFold2's per-token choices of embeddings: chain, copy, entity, molecule and residue types.
PROTEIN_TYPES = ("asym_id", "sym_id", "entity_id", "mol_type", "res_type")


@input_rule(*DETECTOR_FIELDS)
def detector_features(wanted: Wanted):
    """LXMERT's detector features and their boxes: `DETECTOR_BOXES` regions an image, each of
    visual_feat_dim (visual_pos_dim) values."""
    width = config_int(wanted.config, (DETECTOR_FIELDS[wanted.name],))
    return None if width is None else wanted.zeros((wanted.batch, DETECTOR_BOXES, width))


@input_rule(*TRAJECTORY, "returns_to_go")
def trajectory(wanted: Wanted):
    """Decision Transformer's trajectory: a state (state_dim), an action (act_dim) and a
    return-to-go (one number) per step."""
    width = (1 if wanted.name == "returns_to_go"
             else config_int(wanted.config, (TRAJECTORY[wanted.name],)))
    return None if width is None else wanted.zeros((wanted.batch, wanted.steps, width))


@input_rule("timesteps")
def trajectory_timesteps(wanted: Wanted):
    """Decision Transformer's timestep of each step (zeros: they select embeddings)."""
    return wanted.zeros((wanted.batch, wanted.steps), torch.long)


@input_rule("inputs")
def perceiver_inputs(wanted: Wanted):
    """Perceiver's inputs with no preprocessor: vectors of d_model, as its cross-attention
    reads them."""
    width = config_int(wanted.config, ("d_model",))
    return None if width is None else wanted.zeros((wanted.batch, wanted.steps, width))


@input_rule("lang_ids")
def language_ids(wanted: Wanted):
    """X-MOD's language of each example (its adapters')."""
    return wanted.zeros((wanted.batch,), torch.long)


@input_rule("aspect_ratio_ids", "aspect_ratio_mask")
def aspect_ratio(wanted: Wanted):
    """Mllama's aspect ratio of its one image ``(batch, 1)`` and the mask of its max_num_tiles
    tiles ``(batch, 1, tiles)``."""
    tiles = config_int(sub_config(wanted.config, "vision"), ("max_num_tiles",))
    if tiles is None:
        return None
    shape = (wanted.batch, 1) if wanted.name == "aspect_ratio_ids" else (wanted.batch, 1, tiles)
    return wanted.zeros(shape, torch.long)


@input_rule(*DECISION_INPUTS)
def decisions(wanted: Wanted):
    """JEV: one question of each type whose first score row `offsets` keeps (noul, score,
    choice), asked of one prompt. Zeros index rows that exist: mark 0 reads the last token (its
    forward reads marks - 1), type 0 the first offset."""
    offsets = getattr(wanted.config, "offsets", None)
    if not isinstance(offsets, dict):
        return None
    return wanted.zeros((wanted.batch, len(offsets)), torch.long)


@input_rule("task_inputs")
def task_tokens(wanted: Wanted):
    """OneFormer's task tokens, task_seq_len of them."""
    tasks = config_int(wanted.config, ("task_seq_len",))
    return None if tasks is None else wanted.zeros((wanted.batch, tasks), torch.long)


@input_rule("action_embeds")
def action_suffix(wanted: Wanted):
    """PI0's suffix: a token of the robot's state and chunk_size tokens of actions, of its
    action expert's (dit_config) hidden_size."""
    chunk = config_int(wanted.config, ("chunk_size",))
    expert = getattr(wanted.config, "dit_config", None)
    if chunk is None or expert is None:
        return None
    return wanted.zeros((wanted.batch, 1 + chunk, expert.hidden_size))


@input_rule("noise_embeds")
def noise_block(wanted: Wanted):
    """Muse Glimmer's assistant denoises a block of block_size embeddings of hidden_size."""
    block = config_int(wanted.config, ("block_size",))
    if block is None:
        return None
    return wanted.zeros((wanted.batch, block, wanted.config.hidden_size))


@input_rule("last_hidden_state")
def depth_states(wanted: Wanted):
    """Moshi's depth decoder adds its main decoder's last state (input_size wide) at each
    codebook's position."""
    depth = depth_positions(wanted.config)
    if depth is None:
        return None
    width = config_int(wanted.config, ("input_size", "hidden_size"))
    return wanted.zeros((wanted.batch, min(wanted.steps, depth), width))


@input_rule("context_hidden_states")
def target_states(wanted: Wanted):
    """... reading the states of its target model's target_layer_ids layers, concatenated:
    ``steps`` accepted tokens of hidden_size x len(target_layer_ids)."""
    layers = getattr(wanted.config, "target_layer_ids", None)
    if not isinstance(layers, (list, tuple)):
        return None
    return wanted.zeros((wanted.batch, wanted.steps, wanted.config.hidden_size * len(layers)))


@input_rule("patch_ids", "num_patches", "patch_embeds")
def byte_patches(wanted: Wanted):
    """BLT's local encoder's and decoder's patches of ``steps`` bytes, which the patcher of the
    model that holds them cuts: patches of its patch_size bytes (BltConfig's 4, the mean its
    entropy patcher aims at), ``ceil(steps / patch_size)`` of them: each byte's patch
    ``patch_ids``, in order; their count ``num_patches``; the global transformer's state of
    each, ``patch_embeds``, hidden_size_global wide. None where the config has no
    hidden_size_global and cross_attn_k (a local byte model's), or no composite holding it
    keeps a patch_size."""
    config, batch, steps = wanted.config, wanted.batch, wanted.steps
    width = config_int(config, ("hidden_size_global",))
    if width is None or config_int(config, ("cross_attn_k",)) is None:
        return None
    sizes = [config_int(parent, ("patch_size",)) for parent, _ in parent_configs(config)]
    size = next((size for size in sizes if size), None)
    if size is None:
        return None
    count = -(-steps // size)
    if wanted.name == "num_patches":
        return count
    if wanted.name == "patch_embeds":
        return wanted.zeros((batch, count, width))
    ids = torch.arange(steps, device=wanted.device) // size
    return ids.expand(batch, steps).clone()


def _protein(config) -> bool:
    """Whether ``config`` is ESMFold2's: it has num_res_types and max_atoms_per_token."""
    return None not in (config_int(config, ("num_res_types",)),
                        config_int(config, ("max_atoms_per_token",)))


@input_rule("token_index", "residue_index")
def protein_positions(wanted: Wanted):
    """ESMFold2's index of each token of a chain of ``steps`` glycines in the complex and in
    its chain: 0, 1, ..., as its featurizer lays out a protein."""
    if not _protein(wanted.config):
        return None
    return torch.arange(wanted.steps, device=wanted.device).expand(
        wanted.batch, wanted.steps).clone()


@input_rule(*PROTEIN_TYPES)
def protein_types(wanted: Wanted):
    """ESMFold2's chain, copy, entity, molecule and residue types of each token (zeros: they
    select embeddings)."""
    if not _protein(wanted.config):
        return None
    return wanted.zeros((wanted.batch, wanted.steps), torch.long)


@input_rule("token_bonds")
def protein_bonds(wanted: Wanted):
    """ESMFold2's bonds between tokens ``(batch, steps, steps, 1)``: none."""
    if not _protein(wanted.config):
        return None
    return wanted.zeros((wanted.batch, wanted.steps, wanted.steps, 1))


@input_rule("atom_inputs")
def protein_atoms(wanted: Wanted):
    """ESMFold2's ``atom_inputs``, the dataclass of its atoms (`atoms`)."""
    if not _protein(wanted.config):
        return None
    return atoms(wanted.config, wanted.device, batch=wanted.batch, steps=wanted.steps)


def atoms(config, device, *, batch: int, steps: int):
    """ESMFold2's atoms of a chain of ``steps`` glycines, each of GLYCINE_ATOMS heavy atoms,
    padded to a multiple of ATOM_PADDING as its featurizer pads a complex's: their reference
    positions, charges (int8), mask (bool, the padding False), elements, names
    ``(max_chars)`` and tokens; in the dataclass of its modeling module that holds them,
    registered with torch.export (which otherwise refuses its type). None where the module has
    no such dataclass."""
    import dataclasses

    from ..torch_internals import pytree

    holder = next((c for c in vars(modeling_module(config) or object).values()
                   if isinstance(c, type) and dataclasses.is_dataclass(c)
                   and {"atom_to_token", "ref_pos"} <= {f.name for f in dataclasses.fields(c)}),
                  None)
    if holder is None:
        return None
    if holder not in pytree.SUPPORTED_NODES:
        torch.export.register_dataclass(holder)
    real = steps * GLYCINE_ATOMS
    count = -(-real // ATOM_PADDING) * ATOM_PADDING
    index = torch.arange(count, device=device)
    token = (index // GLYCINE_ATOMS).clamp(max=steps - 1).expand(batch, count).clone()
    zeros = torch.zeros((batch, count), dtype=torch.long, device=device)
    mask = (index < real).expand_as(token).clone()  # an expanded input fails export
    return holder(
        ref_pos=torch.zeros((batch, count, 3), device=device),
        ref_charge=zeros.to(torch.int8), atom_attention_mask=mask,
        ref_element=zeros, ref_space_uid=token, atom_to_token=token,
        ref_atom_name_chars=torch.zeros((batch, count, config_int(config, ("max_chars",)) or 4),
                                        dtype=torch.long, device=device))


@input_rule("image")
def bridge_tower_image(wanted: Wanted):
    """An input we know under another name: ``image``, the images that BridgeTower's vision
    tower takes as its first parameter (made as pixel_values, layouts to choose from)."""
    return pixels("pixel_values", sub_config(wanted.config, "vision"), wanted.device,
                  batch=wanted.batch)


@input_rule("context")
def resampler_context(wanted: Wanted):
    """A perceiver resampler's ``context`` (Idefics2's), the states its resampler_n_latents
    latents cross-attend to: ``steps`` vectors of its hidden_size, which its input norm
    reads."""
    width = config_int(wanted.config, ("hidden_size",))
    if not (config_int(wanted.config, ("resampler_n_latents",)) and width):
        return None
    return wanted.zeros((wanted.batch, wanted.steps, width))
