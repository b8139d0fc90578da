"""Every private torch API exportflops uses, in one place, each behind a check that the
installed torch has it.

torch moves its private modules between releases. Each one we use is a `Feature` here: its
dotted path and the analysis that needs it. `require` loads one where it is used; a torch that
lacks it raises `TorchFeatureError` naming the feature, the analysis, and the releases the suite
runs on (which have it), so only that analysis fails and the rest work. The few every analysis
needs (pytree, op types, fake tensors) are loaded through the same table on first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from .errors import TorchFeatureError
from .version import TESTED_TORCH


@dataclass(frozen=True)
class Feature:
    """A private torch object: where it lives and what needs it."""

    path: str
    """``module:attribute`` (the attribute may be dotted), or ``module`` for a whole module."""
    needed_by: str
    """The analysis or step that fails without it, as the error names it."""


_FEATURES: dict[str, Feature] = {}


def _feature(name: str, path: str, needed_by: str) -> None:
    _FEATURES[name] = Feature(path, needed_by)


_CORE = "every analysis"
_feature("pytree", "torch.utils._pytree", _CORE)
_feature("fx_pytree", "torch.fx._pytree", "generation with a transformers cache")
_feature("OpOverload", "torch._ops:OpOverload", _CORE)
_feature("OpOverloadPacket", "torch._ops:OpOverloadPacket", _CORE)
_feature("HigherOrderOperator", "torch._ops:HigherOrderOperator", _CORE)
_feature("higher_order_ops", "torch._ops:_higher_order_ops", _CORE)
_feature("FakeTensor", "torch._subclasses.fake_tensor:FakeTensor", _CORE)
_feature("FakeTensorMode", "torch._subclasses.fake_tensor:FakeTensorMode", _CORE)
_CHECKPOINT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_feature("CheckpointImpl", f"{_CHECKPOINT_WRAPPER}:CheckpointImpl",
         "activation checkpointing plans (fit) and their memory")
_feature("CheckpointWrapper", f"{_CHECKPOINT_WRAPPER}:CheckpointWrapper",
         "activation checkpointing plans (fit) and their memory")
_feature("checkpoint_wrapper", f"{_CHECKPOINT_WRAPPER}:checkpoint_wrapper",
         "activation checkpointing plans (fit) and their memory")
_feature("DataDependentOutputException",
         "torch._subclasses.fake_tensor:DataDependentOutputException", "hf: models on meta")
_feature("DynamicOutputShapeException",
         "torch._subclasses.fake_tensor:DynamicOutputShapeException", "hf: models on meta")
_feature("meta_utils", "torch._subclasses.meta_utils", "deciding branches by values")
_feature("fake_utils", "torch._subclasses.fake_utils", "deciding branches by values")
_feature("compare_tensor_meta", "torch._prims_common:compare_tensor_meta",
         "deciding branches by values")
_feature("TorchDispatchMode", "torch.utils._python_dispatch:TorchDispatchMode",
         "the fast path and runtime replay")
_feature("DisableTorchDispatch", "torch._C:_DisableTorchDispatch", "the fast path")
_feature("DisableTorchFunction", "torch._C:DisableTorchFunction", "the fast path")
_feature("any_autocast_enabled", "torch._C:_is_any_autocast_enabled", "the fast path")
_feature("functorch_transforms_active", "torch._C:_are_functorch_transforms_active",
         "the fast path")
_feature("top_saved_tensors_hooks", "torch._C._autograd:_top_saved_tensors_default_hooks",
         "flops_per_batch's recompute under non-reentrant activation checkpointing")
_feature("enable_python_dispatcher", "torch._dispatch.python:enable_python_dispatcher",
         "runtime replay")
_feature("free_unbacked_symbols", "torch.fx.experimental.symbolic_shapes:free_unbacked_symbols",
         _CORE)
_feature("ShapeEnv", "torch.fx.experimental.symbolic_shapes:ShapeEnv", "hf: models on meta")
_feature("GuardOnDataDependentSymNode",
         "torch.fx.experimental.symbolic_shapes:GuardOnDataDependentSymNode",
         "hf: models on meta")
_feature("int_oo", "torch.utils._sympy.numbers:int_oo", "dynamic sizes")
_feature("decomposition_table", "torch._decomp:decomposition_table", _CORE)
_feature("dispatch_has_kernel", "torch._C:_dispatch_has_kernel", _CORE)
_feature("dispatch_has_kernel_for_dispatch_key",
         "torch._C:_dispatch_has_kernel_for_dispatch_key", _CORE)
_feature("predispatch", "torch._functorch:predispatch", _CORE)
_feature("compiling_state_context", "torch._export.utils:_compiling_state_context",
         "hf: models on meta")
_feature("export_schema_version", "torch._export.serde.schema:SCHEMA_VERSION",
         "reading a saved ExportedProgram")
_feature("grouped_mm_output", "torch._meta_registrations:_create_grouped_mm_output_tensor",
         "memory() of a model calling _grouped_mm in float32 or float16 (an MoE's experts)")
_feature("dtrace_env_var", "torch._logging._internal:DTRACE_ENV_VAR",
         "deciding branches by values")
_feature("use_lazy_graph_module", "torch.fx._lazy_graph_module:_use_lazy_graph_module", _CORE)
_feature("dynamo_config", "torch._dynamo:config", _CORE)
_feature("dynamo_reset", "torch._dynamo:reset", "the fast path")
_feature("proxy_tensor", "torch.fx.experimental.proxy_tensor",
         "a dynamic export's memory formats asked once per shape (each asked per value without)")
_feature("get_proxy_mode", "torch.fx.experimental.proxy_tensor:get_proxy_mode",
         "the fast path's stubs without an op (one op per stub without it)")
_feature("clear_sharding_prop_cache",
         "torch.distributed.tensor.debug:_clear_sharding_prop_cache",
         "fake_process_group (per-rank analyses of several ranks in one process)")
_feature("fake_store", "torch.testing._internal.distributed.fake_pg:FakeStore",
         "fake_process_group (per-rank analyses in one process)")
_feature("clear_sharding_prop_cache",
         "torch.distributed.tensor.debug:_clear_sharding_prop_cache",
         "fake_process_group (per-rank analyses in one process)")
_feature("dynamo_graph_capture_for_export",
         "torch._dynamo.functional_export:dynamo_graph_capture_for_export",
         "per-rank capture of a tensor-parallel (DTensor) model")
_feature("aot_export_joint_with_descriptors",
         "torch._functorch.aot_autograd:aot_export_joint_with_descriptors",
         "per-rank capture of a tensor-parallel (DTensor) model")
_feature("tracing", "torch._guards:tracing",
         "per-rank capture of a tensor-parallel (DTensor) model")
_feature("detect_fake_mode", "torch._guards:detect_fake_mode", "per-rank capture under FSDP2")
_feature("get_sequence_nr", "torch.autograd:_get_sequence_nr", "per-rank capture under FSDP2")
_feature("current_autograd_node", "torch._C:_current_autograd_node",
         "memory: the module of a backward op")
_feature("resolve_process_group", "torch.distributed.distributed_c10d:_resolve_process_group",
         "the collectives of a tensor-parallel rank")
_feature("is_traceable_wrapper_subclass",
         "torch.utils._python_dispatch:is_traceable_wrapper_subclass",
         "memory of a parallelized model (DTensor shards)")
_feature("prims", "torch._prims", "deciding branches by values")
_VIEWS = "a dynamic export's views made from their shapes (torch's own view kernel without it)"
_feature("is_contiguous_or_false", "torch._prims_common:is_contiguous_or_false", _VIEWS)
_feature("fx_experimental_config", "torch.fx.experimental._config", _VIEWS)
_feature("make_fx", "torch.fx.experimental.proxy_tensor:make_fx", "per-rank capture under FSDP2")
_feature("select_conv_backend", "torch._C:_select_conv_backend",
         "memory: the workspaces of cpu convolutions")
_feature("ConvBackend", "torch._C:_ConvBackend", "memory: the workspaces of cpu convolutions")
_feature("all_to_all_single_autograd",
         "torch.distributed._functional_collectives:all_to_all_single_autograd",
         "memory_ranks under expert parallelism (the dispatch and combine)")


def require(name: str) -> Any:
    """The torch object of feature ``name``; `TorchFeatureError` where this torch lacks it."""
    feature = _FEATURES[name]
    module_name, _, attribute = feature.path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in filter(None, attribute.split(".")):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise TorchFeatureError(name, feature.path.replace(":", "."), feature.needed_by,
                                torch.__version__, TESTED_TORCH) from error
    return found


def sequence_nr(node: Any) -> int:
    """The order an autograd node was created in (its private ``_sequence_nr()``), which the
    per-rank capture under FSDP2 matches to the module calls that made it."""
    try:
        return node._sequence_nr()
    except AttributeError as error:
        raise TorchFeatureError("sequence_nr", "torch.autograd.graph.Node._sequence_nr",
                                "per-rank capture under FSDP2", torch.__version__,
                                TESTED_TORCH) from error


def fsdp_all_gather_outputs(module: Any) -> list[torch.Tensor]:
    """The tensors on FSDP2's all-gather outputs of FSDP2 module ``module``'s own parameters
    (each ``FSDPParam``'s ``all_gather_outputs``, `_fsdp_params`): the unsharded storage FSDP2
    resizes in place; none for a module whose unit holds no parameters."""
    return [tensor for fsdp_param in _fsdp_params(module)
            for tensor in fsdp_param.all_gather_outputs]


def fsdp_shards(module: Any) -> list[torch.Tensor]:
    """The shards of FSDP2 module ``module``'s own parameters (each ``FSDPParam``'s
    ``sharded_param``, `_fsdp_params`), held while its unsharded parameters are registered."""
    return [fsdp_param.sharded_param for fsdp_param in _fsdp_params(module)]


def _fsdp_params(module: Any) -> list[Any]:
    """The ``FSDPParam``s of FSDP2 module ``module``'s unit (its private
    ``_get_fsdp_state()._fsdp_param_group``, torch/distributed/fsdp/_fully_shard/)."""
    try:
        group = module._get_fsdp_state()._fsdp_param_group
        return list(group.fsdp_params) if group is not None else []
    except AttributeError as error:
        raise TorchFeatureError("fsdp_params",
                                "FSDPModule._get_fsdp_state()._fsdp_param_group",
                                "memory_ranks under FSDP2", torch.__version__,
                                TESTED_TORCH) from error


def fsdp_reduce_gradients(module: Any) -> None:
    """What torch's pipeline stage runs after a step's last backward on an FSDP2 ``module``
    (``perform_reduce_grad`` in torch/distributed/pipelining/stage.py): its gradients synced
    again, each of its param groups' ``post_backward`` (the reduce-scatter of the gradients
    accumulated unsharded over the microbatches, then the reshard), and the root's final
    callback; private FSDP2 state (``fully_shard.state(module)._state_ctx.all_states``)."""
    from torch.distributed.fsdp import fully_shard

    module.set_is_last_backward(True)
    module.set_reshard_after_backward(True)
    module.set_requires_gradient_sync(True)
    try:
        state = fully_shard.state(module)
        for inner in state._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()
    except AttributeError as error:
        raise TorchFeatureError("fsdp_reduce_gradients",
                                "fully_shard.state(module)._state_ctx.all_states",
                                "memory_ranks of a pipeline under FSDP2", torch.__version__,
                                TESTED_TORCH) from error


def has(name: str) -> bool:
    """Whether this torch has feature ``name``."""
    try:
        require(name)
    except TorchFeatureError:
        return False
    return True


def missing() -> dict[str, str]:
    """The features this torch lacks, each with what needs it: empty on a tested release."""
    return {name: feature.needed_by for name, feature in _FEATURES.items() if not has(name)}


def __getattr__(name: str) -> Any:
    # ``torch_internals.pytree`` and the like: the feature, loaded on first use.
    if name not in _FEATURES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = require(name)
    globals()[name] = value
    return value
