"""`exportflops.conventions`: each stack's training FLOPs beside the graph's count (issue 52).

Each stack's value is checked against its own published code transcribed here (the source
URLs at the commits the formulas cite), or for Hugging Face's Trainer against the installed
transformers' own ``Trainer.floating_point_ops``; the terms against arithmetic on the configs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from exportflops import analyze, conventions
from exportflops.errors import InputError
from exportflops.records import Conventions
from exportflops.stacks.parts import graph_parts

B, T = 2, 16
TOKENS = B * T
VOCAB, WIDTH, FFN, MOE_FFN, LAYERS = 128, 64, 96, 32, 2


def _llama():
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _qwen3_moe():
    return transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, moe_intermediate_size=MOE_FFN,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)


def _deepseek_v3():
    return transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, moe_intermediate_size=MOE_FFN,
        num_hidden_layers=LAYERS, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=64)


def _llama_tied():
    config = _llama()
    config.tie_word_embeddings = True  # the head multiplies by the embedding's table
    return config


CONFIGS = {"llama": _llama, "llama-tied": _llama_tied, "qwen3-moe": _qwen3_moe,
           "deepseek-v3": _deepseek_v3}


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request):
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, VOCAB, (B, T))
    report = analyze(model, (), {"input_ids": ids, "labels": ids}, mode="train")
    return SimpleNamespace(name=request.param, config=config, model=model, ids=ids,
                           report=report, result=conventions(report, config=model))


# torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, torchtitan/models/utils.py
# (https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/
# torchtitan/models/utils.py), get_dense_model_nparams_and_flops and
# get_moe_model_nparams_and_flops, on the model's named_parameters with transformers' names
# put in torchtitan's (tok_embeddings, moe.router, moe.routed_experts, moe.shared_experts);
# head_dims as models/{llama3,qwen3,deepseek_v3}/model.py pass it.
TITAN_NAMES = {"embed_tokens": "tok_embeddings", "mlp.gate.": "moe.router.",
               "mlp.experts.": "moe.routed_experts.", "mlp.shared_experts.": "moe.shared_experts."}


def _titan_flops_per_token(model, config) -> int:
    named = []
    for name, p in model.named_parameters():
        for hf, titan in TITAN_NAMES.items():
            name = name.replace(hf, titan)
        named.append((name, p))
    if config.model_type == "llama":  # get_dense_model_nparams_and_flops
        nparams = sum(p.numel() for _, p in named)
        nparams_embedding = sum(p.numel() for n, p in named if "tok_embeddings" in n)
        head_dims = 2 * (config.hidden_size // config.num_attention_heads)
        nparams_for_matmul = (nparams if config.tie_word_embeddings  # enable_weight_tying
                              else nparams - nparams_embedding)
        return (6 * nparams_for_matmul
                + 6 * config.num_hidden_layers * config.num_attention_heads * head_dims * T)
    embedding = router = shared = experts = dense = 0  # get_moe_model_nparams_and_flops
    for name, p in named:
        if "embedding" in name:
            embedding += p.numel()
            dense += p.numel()
        elif "moe.shared_experts" in name:
            shared += p.numel()
        elif "moe.router" in name:
            router += p.numel()
        elif "moe.routed_experts" in name:
            experts += p.numel()
        else:
            dense += p.numel()
    num_experts = getattr(config, "n_routed_experts", None) or config.num_experts
    active = router + shared + experts * config.num_experts_per_tok // num_experts
    head_dims = (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
                 if config.model_type == "deepseek_v3" else 2 * config.head_dim)
    return (6 * (dense - embedding + active)
            + 6 * config.num_hidden_layers * config.num_attention_heads * head_dims * T)


def test_torchtitan_is_its_own_formula(case):
    assert case.result.stack("torchtitan").flops == TOKENS * _titan_flops_per_token(
        case.model, case.config)


# Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/training/training.py
# num_floating_point_operations, transformer_flops (https://github.com/NVIDIA/Megatron-LM/
# blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/training.py), with the
# arguments Megatron's converters set from these configs; BSHD defaults, no MTP.
def _megatron_args(config) -> SimpleNamespace:
    moe = getattr(config, "num_experts_per_tok", None) is not None
    if config.model_type == "deepseek_v3":
        pattern = [0] * config.first_k_dense_replace + [1] * (
            config.num_hidden_layers - config.first_k_dense_replace)
    else:
        pattern = [1] * config.num_hidden_layers
    mla = config.model_type == "deepseek_v3"
    return SimpleNamespace(
        hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, seq_length=T,
        group_query_attention=config.num_key_value_heads != config.num_attention_heads,
        num_query_groups=config.num_key_value_heads,
        kv_channels=getattr(config, "head_dim", None), ffn_hidden_size=config.intermediate_size,
        swiglu=True, num_experts=4 if moe else None, moe_layer_freq=pattern,
        moe_router_topk=config.num_experts_per_tok if moe else None,
        moe_ffn_hidden_size=getattr(config, "moe_intermediate_size", None),
        moe_shared_expert_intermediate_size=(config.moe_intermediate_size
                                             * config.n_shared_experts) if mla else None,
        multi_latent_attention=mla, q_lora_rank=getattr(config, "q_lora_rank", None),
        kv_lora_rank=getattr(config, "kv_lora_rank", None),
        qk_head_dim=getattr(config, "qk_nope_head_dim", None),
        qk_pos_emb_head_dim=getattr(config, "qk_rope_head_dim", None),
        v_head_dim=getattr(config, "v_head_dim", None), padded_vocab_size=config.vocab_size)


def _megatron(args, batch_size: int) -> float:
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.num_experts is None:
        num_dense_layers, num_moe_layers, num_experts_routed_to = args.num_layers, 0, 0
    else:
        num_moe_layers = sum(args.moe_layer_freq)
        num_dense_layers = args.num_layers - num_moe_layers
        num_experts_routed_to = args.moe_router_topk
    moe_ffn_hidden_size = args.moe_ffn_hidden_size or args.ffn_hidden_size
    shared = args.moe_shared_expert_intermediate_size or 0
    fb, fma, ffn_factor = 3, 2, 3 if args.swiglu else 2
    if args.multi_latent_attention:
        q_term = args.q_lora_rank * (args.hidden_size + args.num_attention_heads * (
            args.qk_head_dim + args.qk_pos_emb_head_dim) + 1)
        self_attn = fb * fma * (
            q_term + args.kv_lora_rank * (args.hidden_size + args.num_attention_heads * (
                args.qk_head_dim + args.v_head_dim) + 1)
            + args.hidden_size * args.qk_pos_emb_head_dim
            + (args.num_attention_heads * args.v_head_dim) * args.hidden_size)
        core = fb * fma * (args.num_attention_heads * (args.qk_head_dim
                                                       + args.qk_pos_emb_head_dim) / 2
                           + args.num_attention_heads * args.v_head_dim / 2)
    else:
        query = args.kv_channels * args.num_attention_heads
        key = value = args.kv_channels * args.num_query_groups
        self_attn = fb * fma * (args.hidden_size * (query + key + value) + query
                                * args.hidden_size)
        core = fb * fma * query / 2 * 2
    tokens, squares = batch_size * args.seq_length, batch_size * args.seq_length ** 2
    return (tokens * (fb * fma * args.hidden_size * (
        args.ffn_hidden_size * ffn_factor * num_dense_layers
        + moe_ffn_hidden_size * num_experts_routed_to * ffn_factor * num_moe_layers
        + shared * ffn_factor * num_moe_layers)
        + self_attn * args.num_layers
        + fb * fma * args.hidden_size * args.padded_vocab_size)
        + squares * core * args.num_layers)


def test_megatron_is_its_own_formula(case):
    assert case.result.stack("megatron-lm").flops == _megatron(_megatron_args(case.config), B)


def test_the_hf_trainer_is_transformers_own_floating_point_ops(case):
    trainer = SimpleNamespace(model=case.model)  # the unbound method reads self.model only
    expected = transformers.Trainer.floating_point_ops(trainer, {"input_ids": case.ids})
    assert case.result.stack("hf-trainer").flops == expected


def test_the_graph_parts_add_up_to_the_report_total(case):
    assert sum(graph_parts(case.report).values()) == case.report.total.flops


def test_every_covered_stack_s_terms_add_up_to_its_difference(case):
    for count in case.result.stacks:
        if count.covered:
            assert sum(t.difference_flops for t in count.terms) == count.difference_flops
            assert count.difference_flops == count.flops - case.report.total.flops


def test_every_projection_weight_runs_once_per_token_in_each_stack_and_the_graph(case):
    """The property that can fail: the graph's projection matmuls are 6 x tokens x weights
    where every stack says so."""
    for count in case.result.stacks:
        for term in count.terms:
            if term.part == "projections":
                assert term.difference_flops == 0, count.stack


def _term(result: Conventions, stack: str, part: str) -> int:
    return next(t.difference_flops for t in result.stack(stack).terms if t.part == part)


def test_torchtitan_counts_the_norm_weights_as_matmul_parameters(case):
    q_norms = 2 * LAYERS * 16 if case.name == "qwen3-moe" else 0  # q_norm, k_norm of head_dim
    mla_norms = LAYERS * (32 + 16) if case.name == "deepseek-v3" else 0  # q_a, kv_a norms
    norms = (2 * LAYERS + 1) * WIDTH + q_norms + mla_norms  # two per block and the final one
    assert _term(case.result, "torchtitan", "norms_and_biases") == 6 * TOKENS * norms


def test_megatron_counts_causal_attention_half_of_torchtitan_s_square(case):
    titan = next(t for t in case.result.stack("torchtitan").terms if t.part == "attention")
    megatron = next(t for t in case.result.stack("megatron-lm").terms if t.part == "attention")
    assert 2 * megatron.theirs_flops == titan.theirs_flops


def test_the_hf_trainer_counts_every_expert_where_the_graph_runs_the_top_k(case):
    if case.name.startswith("llama"):
        pytest.skip("dense")
    moe_layers = 1 if case.name == "deepseek-v3" else LAYERS
    idle = 4 - 2  # experts - num_experts_per_tok
    assert _term(case.result, "hf-trainer", "experts") == (
        6 * TOKENS * moe_layers * idle * 3 * WIDTH * MOE_FFN)  # gate, up, down d x f each


def test_trl_on_deepseek_v3_is_not_covered_where_it_raises(case):
    trl = case.result.stack("trl")
    if case.name != "deepseek-v3":
        assert trl.covered
        return
    assert not trl.covered and trl.flops is None
    assert "decoder_sparse_step" in trl.reason and "AttributeError" in trl.reason


def test_deepspeed_on_an_moe_says_its_forward_does_not_run_on_fake_tensors(case):
    """transformers' grouped_mm experts have a meta (and so fake) kernel for bfloat16 only;
    the dense models are checked in test_deepspeed.py."""
    deepspeed = case.result.stack("deepspeed")
    if case.name.startswith("llama"):
        assert deepspeed.covered
        return
    assert not deepspeed.covered and "does not run on fake tensors" in deepspeed.reason


def test_the_record_round_trips_through_json(case):
    text = case.result.model_dump_json()
    assert Conventions.model_validate_json(text) == case.result


def test_each_stack_s_mfu_is_its_flops_over_the_step_time_and_the_h100_dense_peak(case):
    result = conventions(case.report, config=case.config, step_time_s=0.5, device="h100-sxm")
    peak = 989.5e12  # H100 SXM bf16 dense: the datasheet's 1,979 TFLOP/s with sparsity / 2
    assert result.graph_mfu == pytest.approx(case.report.total.flops / 0.5 / peak)
    titan = result.stack("torchtitan")
    assert titan.mfu == pytest.approx(titan.flops / 0.5 / peak)


def test_verl_logs_zero_for_a_model_type_it_lacks():
    from exportflops.stacks.configured import verl
    from exportflops.stacks.registry import ModelFacts, NotCovered

    facts = ModelFacts(transformers.GPT2Config(), None, B, T, (T,) * B)
    with pytest.raises(NotCovered, match="no formula for model_type 'gpt2': it logs MFU 0"):
        verl(facts)


def test_a_report_without_the_config_is_an_error_that_names_config(case):
    with pytest.raises(InputError, match="config=model.config"):
        conventions(case.report)


def test_the_view_s_term_rows_add_up_to_each_stack_s_total_row(case):
    from exportflops.render.conventions import conventions_view

    text = conventions_view(case.result, note_width=None)
    for count in case.result.stacks:
        if not count.covered:
            assert f"{count.stack} - graph" not in text
            continue
        block = text.split(f"{count.stack} - graph, by part")[1].split("\n", 1)[1]
        block = block.split("\n\n")[0]
        rows = [line.split() for line in block.splitlines()[2:]  # below the header and rule
                if not line.startswith(" ")]  # a wrapped note's second line
        *terms, total = rows
        number = lambda cell: int(cell.replace(",", ""))  # noqa: E731
        for column in (1, 2, 3):
            assert sum(number(r[column]) for r in terms) == number(total[column])
        assert number(total[3]) == count.difference_flops


@pytest.fixture(scope="module")
def padded():
    """A Llama FlopsPerBatch and a batch whose rows keep 20, 12 and 5 of 20 positions."""
    from exportflops import flops_per_batch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama())
    ids = torch.randint(0, VOCAB, (B, T))
    fpb = flops_per_batch(model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                      "labels": ids}, mode="train")
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    batch = {"input_ids": torch.randint(0, VOCAB, (3, 20)), "attention_mask": mask,
             "labels": torch.randint(0, VOCAB, (3, 20))}
    return SimpleNamespace(model=model, fpb=fpb, batch=batch,
                           result=conventions(fpb, batch, config=model.config))


def test_with_padding_the_graph_count_is_the_batch_s_useful_flops(padded):
    step = padded.fpb.step(**padded.batch)
    assert padded.result.graph_flops == step.model_flops
    assert padded.result.tokens == 20 + 12 + 5


def test_the_padding_term_is_what_the_graph_runs_on_padded_positions(padded):
    step = padded.fpb.step(**padded.batch)
    for count in padded.result.stacks:
        if count.covered:
            assert _term(padded.result, count.stack, "padding") == (
                step.executed_flops - step.model_flops)
            assert sum(t.difference_flops for t in count.terms) == count.difference_flops


def test_deepspeed_counts_every_padded_position_of_the_batch(padded):
    """DeepSpeed's formulas read shapes: its forward runs over 3 x 20 positions, padding in
    (deepspeed 0.19.8 profiler.py, by call, as in test_deepspeed.py): per token and layer the
    linears q, k, v, o, gate, up, down (2 x in x out) and F.silu (one per FFN element), per
    row and layer SDPA's q.k and p.v over the 20 x 20 square, per token the LM head; x 3."""
    deepspeed = conventions(padded.fpb, padded.batch, config=padded.model).stack("deepspeed")
    rows, seq, heads, head_dim = 3, 20, 4, 16
    per_token = LAYERS * (2 * WIDTH * (WIDTH + 2 * 32 + WIDTH + 3 * FFN) + FFN) \
        + 2 * WIDTH * VOCAB
    per_row = LAYERS * 2 * 2 * heads * seq * seq * head_dim
    assert deepspeed.flops == 3 * (rows * seq * per_token + rows * per_row)
    assert deepspeed.tokens == rows * seq
    assert sum(t.difference_flops for t in deepspeed.terms) == deepspeed.difference_flops


def test_the_hf_trainer_counts_padded_positions_as_transformers_does(padded):
    trainer = SimpleNamespace(model=padded.model)
    expected = transformers.Trainer.floating_point_ops(trainer, padded.batch)
    hf = padded.result.stack("hf-trainer")
    assert hf.flops == expected and hf.tokens == 3 * 20


def test_verl_counts_the_tokens_of_the_mask_and_their_squares(padded):
    verl = padded.result.stack("verl")
    config = padded.model.config
    hd = WIDTH // 4
    attention = 6 * (20 ** 2 + 12 ** 2 + 5 ** 2) * hd * 4 * LAYERS  # _estimate_qwen2_flops
    assert verl.tokens == 37
    assert next(t.theirs_flops for t in verl.terms if t.part == "attention") == attention
    assert config.model_type == "llama"  # verl's ESTIMATE_FUNC maps it to _estimate_qwen2_flops


def test_the_command_s_conventions_view_prints_torchtitan_s_own_figure(tmp_path, capsys):
    from exportflops.cli import main

    config = _llama()
    config.save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM(config)
    assert main([f"hf:{tmp_path}", "--mode", "train", "--conventions", "--batch", str(B),
                 "--seq", str(T)]) == 0
    expected = TOKENS * _titan_flops_per_token(model, config)
    assert f"torchtitan {expected:,}" in " ".join(capsys.readouterr().out.split())


def test_the_command_refuses_conventions_of_a_forward(tmp_path, capsys):
    from exportflops.cli import main

    _llama().save_pretrained(tmp_path)
    assert main([f"hf:{tmp_path}", "--conventions"]) == 2
    assert "pass --mode train" in capsys.readouterr().err


@pytest.fixture(scope="module")
def biased():
    """Qwen2: biases on the query, key and value projections (transformers' Qwen2Attention)."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, VOCAB, (B, T))
    report = analyze(model, (), {"input_ids": ids, "labels": ids}, mode="train")
    return SimpleNamespace(model=model, ids=ids, result=conventions(report, config=model))


def test_the_hf_trainer_counts_projection_biases_as_matmul_parameters(biased):
    trainer = SimpleNamespace(model=biased.model)
    hf = biased.result.stack("hf-trainer")
    assert hf.flops == transformers.Trainer.floating_point_ops(trainer, {"input_ids": biased.ids})
    norms = (2 * LAYERS + 1) * WIDTH
    biases = LAYERS * (WIDTH + 2 * 2 * 16)  # q: 4 heads x 16, k and v: 2 heads x 16 each
    assert _term(biased.result, "hf-trainer", "norms_and_biases") == 6 * TOKENS * (norms + biases)
    assert _term(biased.result, "hf-trainer", "projections") == 0


def test_torchtitan_has_no_qwen2_and_says_so(biased):
    titan = biased.result.stack("torchtitan")
    assert not titan.covered and "no model of type 'qwen2'" in titan.reason


def test_recompute_is_its_own_term_and_leaves_the_others_as_without_it(case):
    """Reentrant activation checkpointing reruns each block's forward in the backward: the
    report's total grows by the recomputed nodes, which MFU (and every stack) leaves out."""
    if case.name != "llama":
        pytest.skip("one dense model shows it")
    model = transformers.AutoModelForCausalLM.from_config(case.config)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    report = analyze(model, (), {"input_ids": case.ids, "labels": case.ids}, mode="train")
    rerun = report.total.flops - case.report.total.flops
    assert rerun > 0
    with_recompute = conventions(report, config=model).stack("torchtitan")
    without = case.result.stack("torchtitan")
    assert with_recompute.flops == without.flops
    terms = {t.part: t.difference_flops for t in with_recompute.terms}
    assert terms.pop("recompute") == -rerun
    assert terms == {t.part: t.difference_flops for t in without.terms}
