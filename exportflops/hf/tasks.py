"""Inputs that one model family's forward requires, each sized by the config field that the
model's own code reads for it, and made only where the config has that field (else None, and
`hf_inputs.example` raises its typed error). Zeros, as in `hf_inputs`, unless a comment says
why the forward needs other values."""

from __future__ import annotations

from .audio import audio_companions, audio_family_input, speech_dit_input
from .images import image_companions, image_family_input, prompt_image
from .media import (
    IMAGE_TOKEN, IMAGE_TOKENS, config_int, image_size, pixels, sub_config, with_image_tokens,
)
from .parent import modeling_module, parent_configs
from .sizes import depth_positions

#: JEV's decision inputs: per question of the one prompt, the position of its ``<|mark|>``, its
#: number of options and its question type.
DECISION_INPUTS = ("marks", "num_options", "question_type_ids")
#: SegGPT's prompt: an image and its mask, each stacked above the input image (the model
#: concatenates them along the height) to fill the config's image_size.
PROMPT_IMAGES = ("prompt_pixel_values", "prompt_masks")
#: Regions of an image whose detector features LXMERT reads: the 36 objects per image of the
#: Faster R-CNN features it was pre-trained on (Tan & Bansal 2019, LXMERT).
DETECTOR_BOXES = 36
#: The steps of a trajectory an offline-RL transformer reads and the config field of each
#: one's width (a return-to-go, the third, is one number).
TRAJECTORY = {"states": "state_dim", "actions": "act_dim"}
#: The heavy atoms of a glycine (N, CA, C, O): a protein's example is a chain of glycines.
GLYCINE_ATOMS = 4
#: ESMFold2's featurizer pads a complex's atoms to a multiple of this.
ATOM_PADDING = 32


def family_input(name: str, config, device, *, batch: int, steps: int):
    """The input ``name`` of the family whose config field sizes it, ``steps`` long where its
    length is a free choice; None where ``config`` has no such field."""
    import torch

    made = _sized_by_field(name, config, device, batch=batch, steps=steps)
    if made is not None:
        return made

    if name in DECISION_INPUTS and isinstance(getattr(config, "offsets", None), dict):
        # JEV: one question of each type whose first score row `offsets` keeps (noul, score,
        # choice), asked of one prompt. Zeros index rows that exist: mark 0 reads the last
        # token (its forward reads marks - 1), type 0 the first offset.
        return torch.zeros((batch, len(config.offsets)), dtype=torch.long, device=device)
    if name in PROMPT_IMAGES:
        return prompt_image(config, device, batch=batch)
    tasks = config_int(config, ("task_seq_len",))
    if name == "task_inputs" and tasks is not None:  # OneFormer's task tokens
        return torch.zeros((batch, tasks), dtype=torch.long, device=device)
    chunk, expert = config_int(config, ("chunk_size",)), getattr(config, "dit_config", None)
    if name == "action_embeds" and chunk is not None and expert is not None:
        # PI0's suffix: a token of the robot's state and chunk_size tokens of actions, of its
        # action expert's (dit_config) hidden_size.
        return torch.zeros((batch, 1 + chunk, expert.hidden_size), device=device)
    block = config_int(config, ("block_size",))
    if name == "noise_embeds" and block is not None:
        # Muse Glimmer's assistant denoises a block of block_size embeddings of hidden_size.
        return torch.zeros((batch, block, config.hidden_size), device=device)
    depth = depth_positions(config)
    if name == "last_hidden_state" and depth is not None:
        # Moshi's depth decoder adds its main decoder's last state (input_size wide) at each
        # codebook's position.
        width = config_int(config, ("input_size", "hidden_size"))
        return torch.zeros((batch, min(steps, depth), width), device=device)
    layers = getattr(config, "target_layer_ids", None)
    if name == "context_hidden_states" and isinstance(layers, (list, tuple)):
        # ... reading the states of its target model's target_layer_ids layers, concatenated:
        # ``steps`` accepted tokens of hidden_size x len(target_layer_ids).
        return torch.zeros((batch, steps, config.hidden_size * len(layers)), device=device)
    # The families of their own modules, each asked in turn: the first that makes it.
    rules = (lambda: byte_patches(name, config, device, batch=batch, steps=steps),
             lambda: protein_input(name, config, device, batch=batch, steps=steps),
             lambda: speech_dit_input(name, sub_config(config, "dit"), device, batch=batch,
                                      codes=steps),
             lambda: audio_family_input(name, config, device, batch=batch, steps=steps),
             lambda: image_family_input(name, config, device, batch=batch),
             lambda: renamed_input(name, config, device, batch=batch, steps=steps))
    return next((made for rule in rules if (made := rule()) is not None), None)


def protein_input(name: str, config, device, *, batch: int, steps: int):
    """ESMFold2's inputs for a chain of ``steps`` glycines an example, as its featurizer lays
    out a protein: each token's index in the complex and in its chain (0, 1, ...); its chain,
    copy, entity, molecule and residue types (zeros: they select embeddings); no bond between
    tokens ``(batch, steps, steps, 1)``; and ``atom_inputs``, the dataclass of its atoms
    (`atoms`). None where the config has no num_res_types and max_atoms_per_token."""
    import torch

    if None in (config_int(config, ("num_res_types",)),
                config_int(config, ("max_atoms_per_token",))):
        return None
    if name in ("token_index", "residue_index"):
        return torch.arange(steps, device=device).expand(batch, steps).clone()
    if name in ("asym_id", "sym_id", "entity_id", "mol_type", "res_type"):
        return torch.zeros((batch, steps), dtype=torch.long, device=device)
    if name == "token_bonds":
        return torch.zeros((batch, steps, steps, 1), device=device)
    return atoms(config, device, batch=batch, steps=steps) if name == "atom_inputs" else None


def atoms(config, device, *, batch: int, steps: int):
    """ESMFold2's atoms of a chain of ``steps`` glycines, each of GLYCINE_ATOMS heavy atoms,
    padded to a multiple of ATOM_PADDING as its featurizer pads a complex's: their reference
    positions, charges (int8), mask (bool, the padding False), elements, names
    ``(max_chars)`` and tokens; in the dataclass of its modeling module that holds them,
    registered with torch.export (which otherwise refuses its type). None where the module has
    no such dataclass."""
    import dataclasses

    import torch
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


def byte_patches(name: str, config, device, *, batch: int, steps: int):
    """BLT's local encoder's and decoder's patches of ``steps`` bytes, which the patcher of the
    model that holds them cuts: patches of its patch_size bytes (BltConfig's 4, the mean its
    entropy patcher aims at), ``ceil(steps / patch_size)`` of them: each byte's patch
    ``patch_ids``, in order; their count ``num_patches``; the global transformer's state of
    each, ``patch_embeds``, hidden_size_global wide. None where the config has no
    hidden_size_global and cross_attn_k (a local byte model's), or no composite holding it
    keeps a patch_size."""
    import torch

    width = config_int(config, ("hidden_size_global",))
    if (name not in ("patch_ids", "num_patches", "patch_embeds") or width is None
            or config_int(config, ("cross_attn_k",)) is None):
        return None
    sizes = [config_int(parent, ("patch_size",)) for parent, _ in parent_configs(config)]
    size = next((size for size in sizes if size), None)
    if size is None:
        return None
    count = -(-steps // size)
    if name == "num_patches":
        return count
    if name == "patch_embeds":
        return torch.zeros((batch, count, width), device=device)
    ids = torch.arange(steps, device=device) // size
    return ids.expand(batch, steps).clone()


def renamed_input(name: str, config, device, *, batch: int, steps: int):
    """An input we know under another name: ``image``, the images that BridgeTower's vision
    tower takes as its first parameter (made as pixel_values, layouts to choose from); a
    perceiver resampler's ``context`` (Idefics2's), the states its resampler_n_latents latents
    cross-attend to: ``steps`` vectors of its hidden_size, which its input norm reads. None
    where ``config`` has no such field."""
    import torch

    if name == "image":
        return pixels("pixel_values", sub_config(config, "vision"), device, batch=batch)
    width = config_int(config, ("hidden_size",))
    if name == "context" and config_int(config, ("resampler_n_latents",)) and width:
        return torch.zeros((batch, steps, width), device=device)
    return None


def _sized_by_field(name: str, config, device, *, batch: int, steps: int):
    """The input ``name`` of one model family, sized by the config field it is named for; None
    where the config has no such field. LXMERT's detector features and their boxes; Decision
    Transformer's trajectory (a state, an action, a return-to-go, a timestep per step); Mllama's
    aspect ratio of its one image and the mask of its tiles; X-MOD's language per example;
    Perceiver's inputs with no preprocessor (vectors of d_model, as its cross-attention reads
    them)."""
    import torch

    tiles = config_int(sub_config(config, "vision"), ("max_num_tiles",))
    field = {"visual_feats": "visual_feat_dim", "visual_pos": "visual_pos_dim",
             "inputs": "d_model", **TRAJECTORY}.get(name)
    width = config_int(config, (field,)) if field else None
    if name == "returns_to_go":
        width = 1
    if name in ("visual_feats", "visual_pos") and width is not None:
        return torch.zeros((batch, DETECTOR_BOXES, width), device=device)
    if width is not None:
        return torch.zeros((batch, steps, width), device=device)
    long = {"timesteps": (batch, steps), "lang_ids": (batch,)}
    if tiles is not None:
        long |= {"aspect_ratio_ids": (batch, 1), "aspect_ratio_mask": (batch, 1, tiles)}
    if name in long:
        return torch.zeros(long[name], dtype=torch.long, device=device)
    return None


def companions(parameters: set[str], config, inputs: dict, *, steps: int) -> dict:
    """The inputs that follow from the ones ``inputs`` holds, in the family whose forward reads
    them together (each made only where its partners are): SegGPT's image, stacked below its
    prompt, of the prompt's shape; Muse Glimmer's assistant's attention_mask, which its forward
    needs over the keys of its context and its block alike (without one, its mask covers the
    block alone), of ones; PI0's prefix (`camera_prefix`), which its forward reads the keys of
    before its actions (without images it has no cache to read them from); RAG's retrieved
    documents (`retrieved_contexts`); the spectrogram that follows from a model's tokens or
    waveform (`audio_companions`: Voxtral Realtime, XCodec2); the images that follow from the
    tokens or positions (`image_companions`: Aria, Inkling, Gemma 4)."""
    import torch

    made = retrieved_contexts(parameters, config, inputs)
    vlm = getattr(config, "vlm_config", None)
    if "action_embeds" in inputs and vlm is not None and "pixel_values" in parameters:
        made |= camera_prefix(vlm, inputs["action_embeds"], steps=steps)
    if "pixel_values" in inputs and PROMPT_IMAGES[0] in inputs:
        made["pixel_values"] = inputs[PROMPT_IMAGES[0]].clone()
    made |= audio_companions(config, inputs)
    if {"noise_embeds", "context_hidden_states"} <= set(inputs) and "attention_mask" in parameters:
        noise, context = inputs["noise_embeds"], inputs["context_hidden_states"]
        made["attention_mask"] = torch.ones((noise.shape[0], context.shape[1] + noise.shape[1]),
                                            dtype=torch.long, device=noise.device)
    return made | image_companions(parameters, config, inputs, made)


def camera_prefix(vlm, actions, *, steps: int) -> dict:
    """PI0's prefix, which its PaliGemma (``vlm``) reads: one camera's image per example
    ``(batch, 1, channels, height, width)`` of the vision tower's image_size (one image per
    example, as `hf_media.pixels` makes a list of them), that camera marked present, and its
    tokens: the vlm's num_image_tokens placeholders (image_token_id), then ``steps`` of text.
    Empty where the vlm counts no image tokens."""
    import torch

    tokens = config_int(vlm.get_text_config(), IMAGE_TOKENS) or config_int(vlm, IMAGE_TOKENS)
    token = config_int(vlm, IMAGE_TOKEN)
    if tokens is None or token is None:
        return {}
    batch, device = actions.shape[0], actions.device
    vision = vlm.vision_config
    height, width = image_size(vision)
    ids = torch.zeros((batch, tokens + steps), dtype=torch.long, device=device)
    return {"pixel_values": torch.zeros((batch, 1, vision.num_channels, height, width),
                                        device=device),
            # Ones: the camera is there (PI0 matches each image token to a present camera).
            "pixel_attention_mask": torch.ones((batch, 1), dtype=torch.bool, device=device),
            "input_ids": with_image_tokens(ids, token, tokens)}


def retrieved_contexts(parameters: set[str], config, inputs: dict) -> dict:
    """RAG's retrieved documents, which its forward needs where no retriever is set (none is, on
    meta): n_docs contexts per question, each a document joined to the question, of
    max_combined_length tokens (``(batch * n_docs, max_combined_length)``), their mask of
    ones, and a score per document ``(batch, n_docs)``. Empty where the config has no n_docs
    and max_combined_length, or forward takes no context_input_ids."""
    import torch

    docs, length = (config_int(config, (field,)) for field in ("n_docs", "max_combined_length"))
    ids = inputs.get("input_ids")
    if docs is None or length is None or ids is None or "context_input_ids" not in parameters:
        return {}
    batch, device = ids.shape[0], ids.device
    return {"context_input_ids": torch.zeros((batch * docs, length), dtype=torch.long,
                                             device=device),
            "context_attention_mask": torch.ones((batch * docs, length), dtype=torch.long,
                                                 device=device),
            "doc_scores": torch.zeros((batch, docs), device=device)}


