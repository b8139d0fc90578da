"""DeepSpeed's flops profiler in `exportflops.conventions`: its value against its per-call
formulas applied by hand to the calls each model makes, the terms against the graph.

The formulas: deepspeed 0.19.8 (PyPI), deepspeed/profiling/flops_profiler/profiler.py,
https://github.com/deepspeedai/DeepSpeed/blob/v0.19.8/deepspeed/profiling/flops_profiler/profiler.py
(``_linear_flops_compute``, ``_addmm_flops_compute``, ``_attn_flops_compute``,
``_silu_flops_compute``, ``_layer_norm_flops_compute``, ``_elementwise_flops_compute``), the
step as ``(2 + recompute_fwd_factor + 1) x`` the forward (``print_model_profile``, factor 0.0).
With deepspeed installed, the profiler itself is run too.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from exportflops import analyze, conventions

B, T, VOCAB, WIDTH, HEADS, LAYERS = 2, 16, 128, 64, 4, 2
HEAD_DIM = WIDTH // HEADS
STEP = 3  # forward + backward as 2 x forward (bwd_factor = 2 + recompute_fwd_factor 0.0)


def _llama():
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=96, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=64)


def _gpt2():
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=WIDTH,
                                   n_layer=LAYERS, n_head=HEADS)


def _attention() -> int:
    """``_attn_flops_compute``, q (B, H, T, hd) and k, v with T positions: 2 x (q.k MACs
    ``prod(q.shape) x T`` + p.v MACs ``B H T x T x hd``): the whole square, causal or not."""
    return 2 * (B * HEADS * T * HEAD_DIM * T + B * HEADS * T * T * HEAD_DIM)


def _llama_forward() -> tuple[int, int]:
    """(forward FLOPs, of which elementwise) DeepSpeed counts for `_llama`: per layer
    ``F.linear`` for q (H x hd out), k and v (2 x hd out each), o, gate, up and down
    (``2 x input.numel() x out_features``), SDPA, ``F.silu`` on the gate (one per element);
    RMSNorm and rotary are operators and ``torch.rsqrt``, unwrapped: 0; the LM head a linear."""
    tokens, ffn, kv = B * T, 96, 2 * HEAD_DIM
    linear = 2 * tokens * (WIDTH * WIDTH + 2 * WIDTH * kv + WIDTH * WIDTH + 3 * WIDTH * ffn)
    silu = tokens * ffn
    layer = linear + _attention() + silu
    return LAYERS * layer + 2 * tokens * WIDTH * VOCAB, LAYERS * silu


def _gpt2_forward() -> tuple[int, int]:
    """The same for `_gpt2`: GPT-2's Conv1D is ``torch.addmm(bias, x, weight)``, the product
    and one FLOP per bias element (``prod(input.shape)``: 3d, d, 4d, d); ``F.layer_norm``
    with a weight 5 per element, twice a layer and once at the end; gelu_new is operators and
    ``torch.tanh``: 0; the embeddings 0; the LM head a linear."""
    tokens, d = B * T, WIDTH
    addmm = 2 * tokens * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)
    biases = 3 * d + d + 4 * d + d
    norm = 5 * tokens * d
    layer = addmm + biases + _attention() + 2 * norm
    elementwise = LAYERS * (biases + 2 * norm) + norm
    return LAYERS * layer + norm + 2 * tokens * d * VOCAB, elementwise


MODELS = {"llama": (_llama, _llama_forward), "gpt2": (_gpt2, _gpt2_forward)}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    torch.manual_seed(0)
    make, forward = MODELS[request.param]
    model = transformers.AutoModelForCausalLM.from_config(make())
    ids = torch.randint(0, VOCAB, (B, T))
    report = analyze(model, (), {"input_ids": ids, "labels": ids}, mode="train")
    result = conventions(report, config=model, step_time_s=0.5, device="h100-sxm")
    return SimpleNamespace(model=model, ids=ids, report=report, result=result,
                           forward=forward())


def test_deepspeed_is_its_per_call_formulas_times_three(case):
    forward, _ = case.forward
    assert case.result.stack("deepspeed").flops == STEP * forward


def test_deepspeed_s_terms_are_its_elementwise_flops_and_its_backward(case):
    """Linear, the output layer and SDPA agree with the graph's forward (DeepSpeed counts
    2 x in x out per token, the graph's matmuls the same; both the full attention square);
    what differs: the elementwise FLOPs DeepSpeed counts, and its backward, 2 x its forward,
    against the graph's own backward ops."""
    forward, elementwise = case.forward
    terms = {t.part: t for t in case.result.stack("deepspeed").terms}
    assert set(terms) == {"projections", "output_layer", "attention", "elementwise",
                          "backward"}
    for part in ("projections", "output_layer", "attention"):
        assert terms[part].difference_flops == 0, part
    assert terms["elementwise"].theirs_flops == elementwise
    backward = sum(n.cost.flops for n in case.report.nodes if n.phase == "backward")
    assert terms["backward"].theirs_flops == 2 * forward
    assert terms["backward"].ours_flops == backward
    difference = case.result.stack("deepspeed").difference_flops
    assert sum(t.difference_flops for t in terms.values()) == difference
    assert difference == STEP * forward - case.report.total.flops


def test_deepspeed_s_mfu_is_its_step_over_the_time_and_the_h100_dense_peak(case):
    peak = 989.5e12  # H100 SXM bf16 dense: the datasheet's 1,979 TFLOP/s with sparsity / 2
    forward, _ = case.forward
    assert case.result.stack("deepspeed").mfu == pytest.approx(STEP * forward / 0.5 / peak)


def test_deepspeed_without_the_model_is_not_covered_and_says_to_pass_it(case):
    result = conventions(case.report, config=case.model.config)
    deepspeed = result.stack("deepspeed")
    assert not deepspeed.covered and "config=model" in deepspeed.reason


class _Sums(torch.nn.Module):
    def forward(self, x):
        return x + x, x.add(x), torch.add(x, x), x * x  # DeepSpeed wraps the calls only


def test_an_operator_is_not_a_call_deepspeed_wraps():
    from exportflops.stacks.calls import count_calls
    from exportflops.stacks.deepspeed import WATCHED

    calls = count_calls(_Sums(), {"x": torch.ones(3)}, WATCHED)
    assert [c.function for c in calls] == [torch.Tensor.add, torch.add]


def test_the_run_leaves_no_hook_and_the_model_s_mode_as_it_was(case):
    case.model.eval()
    conventions(case.report, config=case.model)
    assert not case.model.training
    assert all(not m._forward_hooks and not m._forward_pre_hooks
               for m in case.model.modules())


def test_deepspeed_s_own_profiler_counts_the_same_forward(case):
    """Optional (deepspeed is not a dependency): DeepSpeed's FlopsProfiler on the model's
    real forward, on cpu."""
    profiler = pytest.importorskip("deepspeed.profiling.flops_profiler.profiler")
    prof = profiler.FlopsProfiler(case.model)
    case.model.train()
    prof.start_profile()
    try:
        case.model(input_ids=case.ids, labels=case.ids)
        forward = prof.get_total_flops()
    finally:
        prof.end_profile()
    assert STEP * forward == case.result.stack("deepspeed").flops
    sums = _Sums()
    prof = profiler.FlopsProfiler(sums)
    prof.start_profile()
    try:
        sums(torch.ones(3))
        assert prof.get_total_flops() == 3 + 3  # x.add(x), torch.add(x, x): 3 elements each
    finally:
        prof.end_profile()
