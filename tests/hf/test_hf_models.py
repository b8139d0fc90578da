"""Hugging Face models built from small configs (no download): MACs derived by hand.

Shared sizes: width d = 64, FFN 128, 2 layers, 4 heads of 16, vocabulary 100, 16 tokens, batch 1.
A (rows x in) @ (in x out) product is rows * in * out MACs; attention is counted dense, per layer
heads * Tq * Tk * head_dim MACs for q.k and as many for p.v.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze

tf = pytest.importorskip("transformers")

D, FFN, LAYERS, HEADS, HEAD_DIM, VOCAB, T = 64, 128, 2, 4, 16, 100, 16
SMALL = dict(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, vocab_size=VOCAB)
IDS = torch.zeros((1, T), dtype=torch.long)

PROJECTIONS = 4 * D * D  # q, k, v, o per token, full heads
MLP = 2 * D * FFN  # up and down per token


def attention(q_tokens, k_tokens=None):
    return 2 * HEADS * q_tokens * (k_tokens or q_tokens) * HEAD_DIM


GQA_PROJECTIONS = D * D + 2 * D * (2 * HEAD_DIM) + D * D  # q, k and v for 2 KV heads, o
SWIGLU = 3 * D * FFN  # gate, up, down
LLAMA_LIKE = LAYERS * (T * (GQA_PROJECTIONS + SWIGLU) + attention(T)) + T * D * VOCAB


def llama_like(config_class):
    return config_class(**SMALL, num_key_value_heads=2, use_cache=False)


EXPERTS, TOP_K = 4, 2


def cases():
    """name -> (build model and inputs, hand-derived MACs)."""
    image = torch.zeros(1, 3, 32, 32)  # 8x8 patches: 16 patches + CLS = 17 tokens
    patches, vit_tokens = 16, 17
    patch_embed = patches * D * (3 * 8 * 8)
    vision = dict(hidden_size=D, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, image_size=32, patch_size=8)
    encoder_layers = LAYERS * (T * (PROJECTIONS + MLP) + attention(T))
    # A decoder layer: self-attention, cross-attention (q, o on its tokens; k, v on the
    # encoder's), FFN; 16 encoder and 16 decoder tokens.
    decoder_layers = LAYERS * (T * (PROJECTIONS + 2 * D * D + MLP) + T * 2 * D * D
                               + attention(T) + attention(T, T))
    head = T * D * VOCAB
    return {
        "llama": (lambda: (tf.LlamaForCausalLM(llama_like(tf.LlamaConfig)), (IDS,), None),
                  LLAMA_LIKE),
        "mistral": (lambda: (tf.MistralForCausalLM(llama_like(tf.MistralConfig)), (IDS,), None),
                    LLAMA_LIKE),
        "qwen2": (lambda: (tf.Qwen2ForCausalLM(llama_like(tf.Qwen2Config)), (IDS,), None),
                  LLAMA_LIKE),
        # MoE: every token runs its top-2 of 4 experts (SwiGLU each) plus the router d x E.
        "mixtral": (lambda: (tf.MixtralForCausalLM(tf.MixtralConfig(
            **SMALL, num_key_value_heads=2, num_local_experts=EXPERTS,
            num_experts_per_tok=TOP_K, use_cache=False)), (IDS,), None),
            LAYERS * (T * (GQA_PROJECTIONS + D * EXPERTS + TOP_K * SWIGLU) + attention(T))
            + head),
        # GPT-2: c_attn d x 3d, c_proj d x d, MLP d x 4d and back; head on all positions.
        "gpt2": (lambda: (tf.GPT2LMHeadModel(tf.GPT2Config(
            n_embd=D, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB, use_cache=False)),
            (IDS,), None),
            LAYERS * (T * (3 * D * D + D * D + 2 * D * 4 * D) + attention(T)) + head),
        # BERT: encoder layers, then the pooler's d x d on the CLS token.
        "bert": (lambda: (tf.BertModel(tf.BertConfig(**SMALL)), (IDS,), None),
                 encoder_layers + D * D),
        # T5: relu FFN, no biases; LM head on the 16 decoder tokens.
        "t5": (lambda: (tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=D, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS, d_kv=HEAD_DIM,
            vocab_size=VOCAB, use_cache=False)), (IDS,), {"decoder_input_ids": IDS}),
            encoder_layers + decoder_layers + head),
        # ViT: patch conv, 17-token encoder, pooler on CLS.
        "vit": (lambda: (tf.ViTModel(tf.ViTConfig(**vision)), (image,), None),
                patch_embed + LAYERS * (vit_tokens * (PROJECTIONS + MLP) + attention(vit_tokens))
                + D * D),
        # CLIP: text tower (16 tokens) and vision tower (17), each projected to 32 on its pooled
        # token; the logits are one 32-long dot product.
        "clip": (lambda: (tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(SMALL), vision_config=vision, projection_dim=32)),
            (), {"input_ids": IDS, "pixel_values": image}),
            encoder_layers + D * 32 + patch_embed
            + LAYERS * (vit_tokens * (PROJECTIONS + MLP) + attention(vit_tokens)) + D * 32 + 32),
        # Whisper: conv1 16 mel bins -> d, kernel 3 over 32 frames; conv2 d -> d, kernel 3,
        # stride 2 -> 16 encoder tokens; a decoder as T5's; the head tied to the embedding.
        "whisper": (lambda: (tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS,
            encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN, vocab_size=VOCAB, num_mel_bins=16, max_source_positions=16,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
            use_cache=False)), (torch.zeros(1, 16, 32),), {"decoder_input_ids": IDS}),
            32 * D * (16 * 3) + 16 * D * (D * 3) + encoder_layers + decoder_layers + head),
    }


CASES = cases()


@pytest.fixture(scope="module", params=list(CASES))
def analyzed(request):
    build, macs = CASES[request.param]
    model, args, kwargs = build()
    return analyze(model.eval(), args, kwargs), macs


def test_matmul_family_macs_equal_the_hand_derivation(analyzed):
    report, macs = analyzed
    assert report.total.macs == macs


def test_no_op_that_does_compute_is_left_uncounted(analyzed):
    report, _ = analyzed
    assert report.uncounted == []
