"""Inputs that one model family's forward requires, each sized by the config field that the
model's own code reads for it, and made only where the config has that field (else None, and
`hf_inputs.example` raises its typed error). Zeros, as in `hf_inputs`, unless a comment says
why the forward needs other values."""

from __future__ import annotations

from .hf_media import config_int

#: JEV's decision inputs: per question of the one prompt, the position of its ``<|mark|>``, its
#: number of options and its question type.
DECISION_INPUTS = ("marks", "num_options", "question_type_ids")
#: SegGPT's prompt: an image and its mask, each stacked above the input image (the model
#: concatenates them along the height) to fill the config's image_size.
PROMPT_IMAGES = ("prompt_pixel_values", "prompt_masks")


def family_input(name: str, config, device, *, batch: int, steps: int):
    """The input ``name`` of the family whose config field sizes it, ``steps`` long where its
    length is a free choice; None where ``config`` has no such field."""
    import torch

    if name in DECISION_INPUTS and isinstance(getattr(config, "offsets", None), dict):
        # JEV: one question of each type whose first score row `offsets` keeps (noul, score,
        # choice), asked of one prompt.
        return torch.zeros((batch, len(config.offsets)), dtype=torch.long, device=device)
    if name in PROMPT_IMAGES:
        return prompt_image(config, device, batch=batch)
    long = {"task_inputs": "task_seq_len"}
    floats = {"state": "max_state_dim"}
    field = long.get(name) or floats.get(name)
    size = config_int(config, (field,)) if field else None
    if size is not None:
        dtype = torch.long if name in long else torch.float
        # OneFormer's task tokens (its task_seq_len); PI0's robot state (max_state_dim, zero
        # padded to it).
        return torch.zeros((batch, size), dtype=dtype, device=device)
    block = config_int(config, ("block_size",))
    if name == "noise_embeds" and block is not None:
        # Muse Glimmer's assistant denoises a block of block_size embeddings of hidden_size.
        return torch.zeros((batch, block, config.hidden_size), device=device)
    layers = getattr(config, "target_layer_ids", None)
    if name == "context_hidden_states" and isinstance(layers, (list, tuple)):
        # ... reading the states of its target model's target_layer_ids layers, concatenated:
        # ``steps`` accepted tokens of hidden_size x len(target_layer_ids).
        return torch.zeros((batch, steps, config.hidden_size * len(layers)), device=device)
    made = speech_dit_input(name, getattr(config, "dit_config", None) or config, device,
                            batch=batch, codes=steps)
    if made is not None:
        return made
    if name == "latents" and config_int(config, ("latent_stride",)) is not None:
        # A Mimi-style codec's decoder: latent frames of hidden_size, which its upsampling
        # convolution (stride latent_stride) reads, ``(batch, hidden_size, frames)``.
        return torch.zeros((batch, config.hidden_size, steps), device=device)
    return None


def prompt_image(config, device, *, batch: int):
    """SegGPT's prompt image (or mask) ``(batch, num_channels, height / 2, width)``: its
    image_size (896, 448) is a prompt above an input, concatenated along the height by its
    forward. None where image_size is not such a pair."""
    import torch

    size = getattr(config, "image_size", None)
    if not (isinstance(size, (list, tuple)) and len(size) == 2):
        return None
    return torch.zeros((batch, config.num_channels, size[0] // 2, size[1]), device=device)


def speech_dit_input(name: str, dit, device, *, batch: int, codes: int):
    """Qwen2.5-Omni's code-to-mel DiT (and Token2Wav around it): ``codes`` speech codes, each
    repeats mel frames of mel_dim; a reference mel as long, which its speaker encoder reads; the
    speaker's embedding (enc_emb_dim) per frame, or once (Token2Wav's conditioning); the time of
    the flow per example. None where ``dit`` has no mel_dim, repeats and enc_emb_dim."""
    import torch

    mel, repeats, speaker = (config_int(dit, (field,)) for field in
                             ("mel_dim", "repeats", "enc_emb_dim"))
    if None in (mel, repeats, speaker):
        return None
    frames = codes * repeats
    shapes = {"hidden_states": (batch, frames, mel), "condition_vector": (batch, frames, mel),
              "reference_mel": (batch, frames, mel), "speaker_embedding": (batch, frames, speaker),
              "conditioning": (batch, speaker), "time_step": (batch,)}
    if name in ("quantized_code", "code"):
        return torch.zeros((batch, codes), dtype=torch.long, device=device)
    return torch.zeros(shapes[name], device=device) if name in shapes else None


def companions(parameters: set[str], config, inputs: dict) -> dict:
    """The inputs that follow from the ones ``inputs`` holds, in the family whose forward reads
    them together (each made only where its partners are): SegGPT's image, stacked below its
    prompt, of the prompt's shape; Muse Glimmer's assistant's attention_mask, which its forward
    needs over the keys of its context and its block alike (without one, its mask covers the
    block alone), of ones."""
    import torch

    made = {}
    if "pixel_values" in inputs and PROMPT_IMAGES[0] in inputs:
        made["pixel_values"] = inputs[PROMPT_IMAGES[0]].clone()
    if {"noise_embeds", "context_hidden_states"} <= set(inputs) and "attention_mask" in parameters:
        noise, context = inputs["noise_embeds"], inputs["context_hidden_states"]
        made["attention_mask"] = torch.ones((noise.shape[0], context.shape[1] + noise.shape[1]),
                                            dtype=torch.long, device=noise.device)
    return made
