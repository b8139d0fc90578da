"""The fast path's cheap pass reuses a functional meta op's result instead of running its
kernel again, and nothing else: results stay new tensors of the right layout, views still alias
their base, in-place ops and ops on real tensors still run, and the plan is the same."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils import _pytree as pytree

from exportflops.capture.blocks import plan_blocks
from exportflops.capture.cheap_ops import Functions, Ops
from exportflops.capture.call_keys import flattened_call, flattened_output, leaves as flat_leaves
from exportflops.examples.llama import Llama, LlamaConfig


def _ops() -> Ops:
    return Ops([], reuse=True)


def test_functional_meta_op_gives_new_tensor_of_recorded_layout():
    a = torch.empty(4, 8, device="meta")
    b = torch.empty(16, 8, device="meta").t()  # non-contiguous argument
    with _ops() as ops:
        first = a @ b
        second = a @ b
    assert second is not first
    assert second.shape == (4, 16) and second.stride() == first.stride() == (16, 1)
    assert ops.events[0] == ops.events[1]


def test_view_still_aliases_and_inplace_still_runs():
    a = torch.empty(4, 8, device="meta")
    with _ops():
        a.t()
        view = a.t()
        a.unsqueeze_(0)
        a.unsqueeze_(0)
    assert view._base is a
    assert a.shape == (1, 1, 4, 8)  # both in-place ops changed it


def test_ops_on_real_tensors_compute_values():
    with _ops():
        first = torch.arange(4) * 2
        second = torch.arange(4) * 3
        third = torch.arange(4) * 3
    assert first.tolist() == [0, 2, 4, 6]
    assert second.tolist() == third.tolist() == [0, 3, 6, 9]


def test_default_dtype_is_part_of_the_key():
    before = torch.get_default_dtype()
    try:
        with _ops():
            single = torch.ones(3, device="meta")
            torch.set_default_dtype(torch.float64)
            double = torch.ones(3, device="meta")
    finally:
        torch.set_default_dtype(before)
    assert single.dtype == torch.float32 and double.dtype == torch.float64


def test_equal_scalars_of_other_types_are_other_keys():
    # aten.full infers its dtype from the fill value's type: 1, True and 1.0 compare equal in
    # Python, and a key holding the value alone would hand the int64 result to the other two.
    with _ops() as ops:
        results = [torch.ops.aten.full.default([2], fill, device="meta")
                   for fill in (1, True, 1.0, 1)]
    assert [t.dtype for t in results] == [torch.int64, torch.bool, torch.float32, torch.int64]
    assert len(ops.results) == 3  # the second int fill is the first's result again
    assert ops.events[0] == ops.events[3] != ops.events[1]


@pytest.mark.parametrize("grad", [False, True], ids=["no grad (functions reused)", "grad"])
def test_plan_is_the_same_with_and_without_reuse(monkeypatch, grad):
    config = LlamaConfig(vocab_size=64, dim=32, n_layers=4, n_heads=4, n_kv_heads=2,
                         head_dim=8, ffn_dim=64, max_seq_len=16)
    with torch.device("meta"):
        model = Llama(config)
    ids = torch.zeros((1, 8), dtype=torch.long, device="meta")
    with torch.set_grad_enabled(grad):
        with_reuse = plan_blocks(model, (ids,), {})
        monkeypatch.setattr("exportflops.capture.cheap_ops._all_meta", lambda inputs, out: False)
        without = plan_blocks(model, (ids,), {})
    models = {path: repeat.model for path, repeat in with_reuse.repeats.items()}
    assert all(models[f"layers.{i}"] == "layers.0" for i in (1, 2, 3))
    assert with_reuse.repeats == without.repeats


_T = torch.empty(2, device="meta")


@pytest.mark.parametrize("args, kwargs", [
    ((), {}), ((_T,), {}), ((_T, 1, None, 2.0, torch.nn.Parameter(_T), torch.float32), {}),
    (([_T, _T],), {}), ((_T,), {"mask": None}),
], ids=["nothing", "a tensor", "leaves", "a list", "a keyword"])
def test_module_call_flattens_as_pytree_does(args, kwargs):
    leaves, spec = flattened_call(args, kwargs)
    expected_leaves, expected_spec = pytree.tree_flatten((args, kwargs))
    assert spec == expected_spec and hash(spec) == hash(expected_spec)
    assert len(leaves) == len(expected_leaves)
    assert all(a is b for a, b in zip(leaves, expected_leaves))
    for output in args:
        assert flattened_output(output)[1] == pytree.tree_flatten(output)[1]


class _Dispatched(TorchDispatchMode):
    """Counts the ops that reach the dispatcher (entered above `Ops`: it sees them first)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_torch_function_seen_before_is_not_run_and_gives_its_events_again():
    x = torch.empty(4, 3, device="meta")
    ops = Ops([], reuse=True)
    with torch.no_grad(), ops, _Dispatched() as dispatched, Functions(ops):
        first = F.softmax(x, -1)
        ran, events = dispatched.ops, list(ops.events)
        second = F.softmax(x, -1)
    assert ran >= 1 and dispatched.ops == ran  # the second call dispatched nothing
    assert second is not first
    assert second.shape == (4, 3) and second.stride() == (3, 1)
    assert ops.events == events + events


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


# A function with a shape kernel, its arguments, and whether the kernel makes the output (else
# torch's kernel runs): (*, in) x (out, in) linears, layer norms, SDPA on (B, heads, T, E),
# gelu and broadcast arithmetic; a transposed input, mixed dtypes and grouped heads are torch's.
KERNEL_CASES = {
    "linear, 3-d": (F.linear, (_meta(2, 5, 16), _meta(8, 16), _meta(8)), {}, True),
    "linear of a transposed input": (F.linear, (_meta(16, 5).t(), _meta(8, 16)), {}, False),
    "layer norm": (F.layer_norm, (_meta(2, 5, 16), (16,), _meta(16), _meta(16)), {}, True),
    "causal SDPA": (F.scaled_dot_product_attention, (_meta(2, 4, 5, 8),) * 3,
                    {"is_causal": True}, True),
    "SDPA of transposed heads": (F.scaled_dot_product_attention,
                                 (_meta(2, 5, 4, 8).transpose(1, 2),) * 3, {}, True),
    "SDPA with a boolean mask": (F.scaled_dot_product_attention, (_meta(2, 4, 5, 8),) * 3,
                                 {"attn_mask": _meta(5, 5, dtype=torch.bool)}, True),
    "SDPA with grouped heads": (F.scaled_dot_product_attention,
                                (_meta(2, 4, 5, 8), _meta(2, 2, 5, 8), _meta(2, 2, 5, 8)),
                                {"enable_gqa": True}, False),
    "gelu": (F.gelu, (_meta(2, 5, 16),), {"approximate": "tanh"}, True),
    "broadcast add": (torch.Tensor.__add__, (_meta(2, 5, 16), _meta(16)), {}, True),
    "broadcast mul": (torch.mul, (_meta(5, 1), _meta(2, 5, 16)), {}, True),
    "sum of two dtypes": (torch.add, (_meta(2, 5), _meta(2, 5, dtype=torch.bfloat16)), {},
                          False),
}


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_a_first_call_made_by_its_shape_kernel_is_torchs_tensor(name):
    function, args, kwargs, made = KERNEL_CASES[name]
    torchs = function(*args, **kwargs)
    ops = Ops([], reuse=True)
    with torch.no_grad(), ops, _Dispatched() as dispatched, Functions(ops):
        ours = function(*args, **kwargs)
        again = function(*args, **kwargs)
    assert (ours.shape, ours.stride(), ours.dtype, ours.is_meta) == \
        (torchs.shape, torchs.stride(), torchs.dtype, True)
    assert (again.shape, again.stride()) == (ours.shape, ours.stride())
    assert (dispatched.ops == 0) == made  # made from the shapes: no op ran
    assert ops.events[:len(ops.events) // 2] == ops.events[len(ops.events) // 2:]


def test_a_function_returning_its_argument_or_a_view_of_it_runs_each_time():
    x = torch.empty(4, 3, device="meta")
    ops = Ops([], reuse=True)
    with torch.no_grad(), ops, Functions(ops):
        x.t(), x.contiguous()
        view, same = x.t(), x.contiguous()
    assert view._base is x and same is x


def test_a_view_function_is_passed_through_after_its_first_call_and_its_ops_still_recorded():
    x = torch.empty(4, 6, device="meta")
    ops = Ops([], reuse=True)
    with torch.no_grad(), ops, Functions(ops) as functions:
        views = [x.view(2, 2, 6) for _ in range(3)]
    assert torch.Tensor.view in functions.passed and not functions.results
    assert all(v._base is x and v.shape == (2, 2, 6) for v in views)
    assert [str(e[0]) for e in ops.events] == ["aten.view.default"] * 3


@pytest.mark.parametrize("tree", [
    (), (torch.empty(1), 2, None), [torch.empty(1), 2.0], {"a": torch.empty(1), "b": "s"},
    torch.empty(1), (torch.empty(1), [3, 4]), {"a": (torch.empty(1),)},
], ids=["empty", "a flat tuple", "a flat list", "a flat dict", "a leaf", "nested",
        "a dict of tuples"])
def test_leaves_are_pytrees(tree):
    leaves, expected = flat_leaves(tree), pytree.tree_leaves(tree)
    assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected))


def test_a_function_writing_its_argument_in_place_runs_each_time():
    # max_norm renormalizes the rows of the weight it looks up, in place
    ids = torch.zeros(2, 3, dtype=torch.long, device="meta")
    weight = torch.empty(10, 4, device="meta")
    ops = Ops([], reuse=True)
    with torch.no_grad(), ops, _Dispatched() as dispatched, Functions(ops) as functions:
        F.embedding(ids, weight, max_norm=1.0)
        ran = dispatched.ops
        F.embedding(ids, weight, max_norm=1.0)
    assert not functions.results and dispatched.ops == 2 * ran
    assert [str(e[0]) for e in ops.events].count("aten.embedding_renorm_.default") == 2


def test_with_grad_a_function_runs_and_records_its_backward():
    x, weight = torch.empty(4, 3, device="meta"), torch.empty(5, 3, device="meta",
                                                                   requires_grad=True)
    ops = Ops([], reuse=True)
    with torch.enable_grad(), ops, Functions(ops):
        outputs = [F.linear(x, weight) for _ in range(2)]
    assert all(out.grad_fn is not None for out in outputs)


class _CallsAModuleItMakesAndCatchesAnError(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.fails = _Fails()

    def forward(self, x):
        try:
            self.fails(x)
        except ValueError:
            pass
        return nn.Identity()(self.linear(x))  # a module of no model's tree


class _Fails(nn.Module):
    def forward(self, x):
        raise ValueError("no")


def test_calls_around_a_module_outside_the_model_and_a_failed_call_still_pair_up():
    with torch.device("meta"):
        model = nn.Sequential(*[_CallsAModuleItMakesAndCatchesAnError() for _ in range(3)])
    with torch.no_grad():
        plan = plan_blocks(model, (torch.empty(2, 4, device="meta"),), {})
    assert {path: repeat.model for path, repeat in plan.repeats.items()} == {"1": "0", "2": "0"}
