"""Ops declared free of arithmetic, each group with the reason reports show for it."""

from __future__ import annotations

import operator

import torch

from .registry import FORMULAS, aten_ops
from ..torch_internals import predispatch


#: The reasons reports show for the three kinds of arithmetic-free ops (also prims.py's).
VIEW = "view or metadata: aliases its input, reads no tensor data"
COPY = "data movement: copies, gathers or rearranges elements without arithmetic"
CREATION = "creation: fills a new tensor, reads no tensor data"


FORMULAS.register_zero(
    aten_ops("view", "_unsafe_view", "_reshape_alias", "expand", "expand_as", "permute",
         "transpose", "t", "squeeze", "unsqueeze", "slice", "select", "narrow", "as_strided",
         "alias", "detach", "unflatten", "unbind", "split", "split_with_sizes",
         "chunk", "tensor_split", "view_as", "unfold", "diagonal", "movedim", "swapaxes",
         "swapdims", "view_as_real", "view_as_complex", "real", "imag", "conj", "_conj",
         "_neg_view", "lift_fresh",
         "_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_size", "sym_numel",
         "sym_stride", "sym_storage_offset", "sym_constrain_range",
         "sym_constrain_range_for_size", "_functional_sym_constrain_range_for_size",
         "_functional_assert_async", "_local_scalar_dense", "item", "set_grad_enabled",
         "broadcast_tensors", "size", "stride", "storage_offset", "_functional_sym_constrain_range",
         "_resize_output", "_print", "_make_dep_token", "dense_dim", "sparse_dim",
         "is_coalesced", "is_pinned")
    + [torch.ops.prim.device],
    VIEW,
    moves="nothing",
)
FORMULAS.register_zero(
    [operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
     operator.truediv, operator.mod, operator.neg, operator.pow, operator.eq, operator.ne,
     operator.lt, operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
     operator.not_, torch.sym_int, torch.sym_float, torch.sym_max, torch.sym_min,
     torch.sym_not, torch.sym_sum, torch.sym_ite],
    "Python arithmetic on sizes or tuple unpacking, no tensor work",
    moves="nothing",
)
FORMULAS.register_zero(
    aten_ops("clone", "copy", "_to_copy", "cat", "stack", "hstack", "vstack",
         "index", "index_select", "gather", "masked_select", "masked_scatter",
         "masked_scatter_backward", "take", "take_along_dim", "slice_scatter", "select_scatter",
         "diagonal_scatter", "as_strided_scatter", "constant_pad_nd", "pad", "reflection_pad1d",
         "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
         "replication_pad3d", "repeat", "repeat_interleave", "roll", "flip", "tril", "triu",
         "nonzero", "nonzero_static", "upsample_nearest1d", "upsample_nearest2d",
         "upsample_nearest3d",
         "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
         "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
         "im2col", "col2im", "lift_fresh_copy", "resize", "resize_as", "_unsafe_index",
         "view_copy", "expand_copy", "permute_copy", "transpose_copy", "unsqueeze_copy",
         "squeeze_copy", "slice_copy", "select_copy", "alias_copy", "split_copy",
         "split_with_sizes_copy", "unbind_copy", "t_copy", "diagonal_copy", "as_strided_copy",
         "detach_copy", "_reshape_copy", "unfold_copy", "_pack_padded_sequence", "_pin_memory",
         "_jagged_to_padded_dense_forward", "_padded_dense_to_jagged_forward", "_spdiags",
         "_convert_weight_to_int4pack_for_cpu", "_dyn_quant_pack_4bit_weight",
         "_pack_padded_sequence_backward", "_pad_packed_sequence")
    # Per overload: scatter.reduce and scatter.value_reduce add or multiply (formulas/reduce.py).
    + aten_ops("scatter.src", "scatter.value", "scatter.src_out", "scatter.value_out",
               "scatter_.src", "scatter_.value"),
    COPY,
    moves="copy",
)
FORMULAS.register_zero(
    aten_ops("reshape", "flatten", "contiguous", "to", "ravel"),
    "view when the input's strides allow (moves nothing), else a copy (a reshape of GQA's "
    "expanded keys, a transpose made contiguous)",
    moves="view-or-copy",
)
FORMULAS.register_zero(
    aten_ops("empty", "empty_like", "empty_strided", "empty_permuted", "zeros", "zeros_like",
         "ones", "ones_like", "full", "full_like", "new_empty", "new_empty_strided",
         "new_zeros", "new_ones", "new_full", "scalar_tensor", "arange", "linspace", "logspace",
         "eye", "fill", "zero", "rand", "rand_like", "randn", "randn_like", "randint",
         "randint_like", "randperm", "bernoulli", "normal", "uniform", "poisson",
         "_standard_gamma"),
    CREATION,
    moves="write",
)

# vmap's bookkeeping, which export records when a model vmaps in pre-dispatch (flex attention's
# block mask builds one): entering and leaving a batching level, no tensor work.
FORMULAS.register_zero(
    [predispatch.lazy_load_decompositions, predispatch._vmap_increment_nesting,
     predispatch._vmap_decrement_nesting, predispatch._add_batch_dim,
     predispatch._remove_batch_dim],
    "vmap bookkeeping: enters or leaves a batching level, no tensor work",
    moves="nothing",
)
