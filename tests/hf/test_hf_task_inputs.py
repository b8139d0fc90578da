"""Inputs of one model family each (the rules of `exportflops.hf.tasks`), sized by the config field
the model's own code reads for it; each model then analyzes with every op counted.

Sizes from transformers 5.23's default configs, at batch 1 and the default length
HF_DEFAULT_SEQ_LEN = 128 where the length is a free choice (frames, codes, accepted tokens):
Mimi's and Pocket TTS's decoders upsample latents of hidden_size 512 (Pocket TTS's latent_dim
32 is its encoder's projection, not what the decoder reads); OneFormer's task_seq_len 77; JEV's
offsets name three question types (noul, score, choice); SegGPT's image_size (896, 448) is a
prompt above an input image of num_channels 3; Phi-4-multimodal's audio encoder has input_size
80 mel bins; Dots3-Note's audio encoder feature_size 128 bins and hop_length 160; Muse Glimmer's
assistant block_size 16 of hidden_size 6656; Qwen2.5-Omni's DiT mel_dim 80, repeats 2 mel frames
per code, enc_emb_dim 192; PI0's chunk_size 50 actions, its action expert's (dit_config)
hidden_size 1024, its PaliGemma's num_image_tokens 256 (224 / 14 = 16 a side) and
image_token_id 257152 of images 224 x 224 x 3; BLT's local encoder and decoder: bytes cut into
patches of BltConfig's patch_size 4, so 128 / 4 = 32 patches, the decoder's hidden_size 1024
and hidden_size_global 2048; ESMFold2: a chain of 128 glycines, a token each, with no bonds
between tokens.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.inputs import HF_DEFAULT_SEQ_LEN, UnknownInputError, example
from exportflops.hf.media import mask
from exportflops.errors import UsageError
from tests.cli_support import analyzes_with_every_op_counted, input_shapes, named_inputs

tf = pytest.importorskip("transformers")
META = torch.device("meta")
SEQ = HF_DEFAULT_SEQ_LEN

# model type -> {input name: shape} at one layer, batch 1, default length.
CASES = {
    "mimi_decoder": {"latents": (1, 512, SEQ)},
    "pocket_tts_audio_tokenizer_decoder": {"latents": (1, 512, SEQ)},
    "jev": {"input_ids": (1, SEQ), "marks": (1, 3), "num_options": (1, 3),
            "question_type_ids": (1, 3)},
    # Prompt and input each half of the 896 rows: 448 x 448.
    "seggpt": {"pixel_values": (1, 3, 448, 448), "prompt_pixel_values": (1, 3, 448, 448),
               "prompt_masks": (1, 3, 448, 448)},
    # Frames first, 128 of 80 bins, and a mask over the frames.
    "phi4_multimodal_audio": {"hidden_states": (1, SEQ, 80), "mask": (1, SEQ)},
    # 128 bins x 128 frames; one length per example.
    "dots3_note_audio_encoder": {"input_features": (1, 128, 128), "chunk_sample_lengths": (1,)},
    # 128 codes, 2 x 128 = 256 mel frames of 80 bins; the reference as long.
    "qwen2_5_omni_dit": {"hidden_states": (1, 2 * SEQ, 80), "condition_vector": (1, 2 * SEQ, 80),
                         "speaker_embedding": (1, 2 * SEQ, 192), "quantized_code": (1, SEQ),
                         "time_step": (1,)},
    "qwen2_5_omni_token2wav": {"code": (1, SEQ), "conditioning": (1, 192),
                               "reference_mel": (1, 2 * SEQ, 80)},
    # A state token and 50 action tokens of 1024; one camera; 256 image tokens, then 128 of text.
    "pi0": {"action_embeds": (1, 1 + 50, 1024), "pixel_values": (1, 1, 3, 224, 224),
            "pixel_attention_mask": (1, 1), "input_ids": (1, 256 + SEQ)},
    "blt_local_encoder": {"input_ids": (1, SEQ), "patch_ids": (1, SEQ)},
    "esmfold2": {"token_index": (1, SEQ), "res_type": (1, SEQ), "token_bonds": (1, SEQ, SEQ, 1)},
    # The local encoder's byte states, and the global transformer's state of each patch.
    "blt_local_decoder": {"inputs_embeds": (1, SEQ, 1024), "patch_embeds": (1, SEQ // 4, 2048)},
    # The SAM tower's 1024-px image in patches of 16, its neck's two downsamples halving the
    # 64 a side twice: 16 x 16 = 256 patches, then the 256 queries of a 1024-px image.
    "deepseek_ocr2_encoder": {"inputs_embeds": (1, 256 + 256, 4096)},
}
#: Those whose export then fails in transformers' own code, not for want of an input:
#: Token2Wav's ODE solver loops while a tensor's value says (Eq(u0, 1) on its time points).
NOT_EXPORTED = {"qwen2_5_omni_token2wav"}


@pytest.mark.parametrize("model_type", list(CASES))
def test_each_family_input_is_shaped_from_its_config(model_type):
    assert input_shapes(model_type, CASES[model_type]) == CASES[model_type]


@pytest.mark.parametrize("model_type", [t for t in CASES if t not in NOT_EXPORTED])
def test_the_model_then_analyzes_with_every_op_counted(model_type):
    analyzes_with_every_op_counted(model_type)


def test_muse_glimmers_assistant_reads_a_block_and_the_context_of_its_target_layers():
    # block_size 16 of hidden_size 6656; the context is as wide as the target layers hf: keeps
    # (its projection reads hidden_size x len(target_layer_ids)); the mask spans the context's
    # 128 accepted tokens and the block's 16.
    model, args, kwargs = hf_model("muse_glimmer_assistant", META, None, layers=1)
    named = named_inputs(model, args, kwargs)
    width = 6656 * len(model.config.target_layer_ids)
    assert model.encoder.fc.in_features == width
    assert tuple(named["noise_embeds"].shape) == (1, 16, 6656)
    assert tuple(named["context_hidden_states"].shape) == (1, SEQ, width)
    assert tuple(named["attention_mask"].shape) == (1, SEQ + 16)
    assert not analyze(model, args, kwargs).uncounted


def test_dots3_lengths_are_the_samples_of_every_frame():
    # Frames first, 64 of them (the axis that is not feature_size's 128 bins): 64 x hop_length
    # 160 = 10,240 samples each, so that no frame is masked as padding.
    config = tf.AutoConfig.for_model("dots3_note_audio_encoder")
    lengths = mask("chunk_sample_lengths", torch.zeros((2, 64, 128)), config, config,
                   batch=2)
    assert lengths.tolist() == [64 * 160, 64 * 160]


@pytest.mark.parametrize(("frames", "lengths"), [(3000, [1500, 1500]), (3001, None)])
def test_concatenated_frames_split_evenly_into_the_batch_or_say_so(frames, lengths):
    # Qwen2.5-Omni's audio encoder: 128 mel bins first, two examples' frames end to end.
    config = tf.AutoConfig.for_model("qwen2_5_omni_audio_encoder")
    features = torch.zeros((128, frames))
    if lengths is None:
        with pytest.raises(UsageError, match="batch=2.*feature_lens"):
            mask("feature_lens", features, config, config, batch=2)
    else:
        assert mask("feature_lens", features, config, config, batch=2).tolist() == lengths


def test_oneformer_reads_task_tokens_of_its_task_seq_len():
    # On cpu: OneFormer's own code makes a tensor on cpu that meets meta tensors. Two layers:
    # at one, a loop of its own code runs no time and reads a variable it never set.
    model, args, kwargs = hf_model("oneformer", torch.device("cpu"), None, layers=2)
    named = named_inputs(model, args, kwargs)
    assert tuple(named["task_inputs"].shape) == (1, 77)
    assert named["task_inputs"].dtype == torch.long
    assert not analyze(model, args, kwargs).uncounted


@pytest.mark.parametrize("name", ["task_inputs", "marks", "prompt_pixel_values", "latents",
                                  "noise_embeds", "action_embeds", "quantized_code"])
def test_a_family_input_is_refused_where_the_config_lacks_its_field(name):
    # BERT's config has none of task_seq_len, offsets, an (h, w) image_size, latent_stride,
    # block_size, chunk_size and dit_config, mel_dim: the typed error names the input.
    config = tf.AutoConfig.for_model("bert")
    with pytest.raises(UnknownInputError, match=repr(name)):
        example(name, config, META, batch=1, seq=None)


def test_a_depth_decoder_takes_a_position_per_codebook(tmp_path):
    # Moshi's depth decoder runs across the num_codebooks codebooks of one frame; its config
    # keeps max_position_embeddings num_codebooks + 1 (9 of 8 by default), and its forward
    # adds the main decoder's last state, input_size wide, at each position.
    from exportflops.hf.modalities import text_length
    from exportflops.errors import UsageError
    from transformers.models.moshi.configuration_moshi import MoshiDepthConfig

    config = MoshiDepthConfig(hidden_size=32, input_size=16, num_codebooks=4, head_dim=16,
                              num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                              num_key_value_heads=2, vocab_size=50, audio_vocab_size=40)
    assert config.max_position_embeddings == 9
    assert text_length(config, None) == 4
    with pytest.raises(UsageError, match="pass seq=4 or less"):
        text_length(config, 5)
    config.save_pretrained(tmp_path)
    # On cpu its branch on each position's value is decided, and what it reads after it found.
    spec = str(tmp_path / "config.json")
    _, args, kwargs = hf_model(spec, torch.device("cpu"), None)
    assert [tuple(a.shape) for a in args] == [(1, 4)]
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"last_hidden_state": (1, 4, 16)}
    analyzes_with_every_op_counted(spec, torch.device("cpu"))


def test_blts_bytes_are_cut_into_patches_of_its_patch_size():
    # 128 bytes in patches of BltConfig's patch_size 4: bytes 0-3 in patch 0, ..., 124-127
    # in patch 31; 32 patches.
    named = named_inputs(*hf_model("blt_local_encoder", torch.device("cpu"), None, layers=1))
    assert named["patch_ids"].tolist() == [[byte // 4 for byte in range(SEQ)]]
    assert named["num_patches"] == SEQ // 4


def test_esmfold2s_atoms_are_four_a_glycine_padded_to_a_multiple_of_32():
    # 10 glycines of 4 heavy atoms: 40 atoms, padded to 64; atom 39 is the last glycine's (9),
    # the padding is masked out and points at the last token too.
    from exportflops.hf.tasks import atoms

    atom = atoms(tf.AutoConfig.for_model("esmfold2"), META, batch=2, steps=10)
    assert tuple(atom.ref_pos.shape) == (2, 64, 3)
    assert tuple(atom.ref_atom_name_chars.shape) == (2, 64, 4)  # max_chars 4
    cpu = atoms(tf.AutoConfig.for_model("esmfold2"), torch.device("cpu"), batch=1, steps=10)
    mask = cpu.atom_attention_mask
    assert mask.sum().item() == 40 and mask.dtype == torch.bool
    assert cpu.atom_to_token[0, [0, 3, 4, 39, 63]].tolist() == [0, 0, 1, 9, 9]


def test_deepseek_ocr2s_encoder_marks_the_patches_before_its_queries():
    named = named_inputs(*hf_model("deepseek_ocr2_encoder", META, None, layers=1))
    assert named["num_patches"] == 16 * 16
