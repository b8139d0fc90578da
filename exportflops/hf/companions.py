"""The inputs that follow from others a forward was given, in the families whose forwards read
them together, each made only where its partners are: SegGPT's image below its prompt, Muse
Glimmer's assistant's mask, PI0's camera prefix, RAG's retrieved documents, and the audio and
image companions of `audio` and `images`. Zeros, as in `inputs`, unless a comment says why."""

from __future__ import annotations

from .audio import audio_companions
from .images import PROMPT_IMAGES, image_companions
from .media import IMAGE_TOKEN, IMAGE_TOKENS, config_int, image_size, with_image_tokens


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
    example, as `media.pixels` makes a list of them), that camera marked present, and its
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


