"""The models the memory tests measure, each with its parameters derived by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from exportflops.examples.gpt2 import GPT, GPTConfig

FP32 = 4  # bytes per float32 element


@dataclass(frozen=True)
class Case:
    build: Callable[[], tuple[nn.Module, tuple, dict]]
    """A fresh model (a real run trains it) and its inputs."""
    loss: Callable[[object], torch.Tensor]
    """Output -> the step's loss, as `exportflops.memory`'s default takes it."""
    params: int
    """Parameter elements, derived by hand below."""
    tensors: int
    """Parameter tensors (AdamW keeps a 0-dim float32 ``step`` for each)."""
    inner_leaves: bool = False
    """Whether the backward makes leaves of its own (reentrant checkpointing reruns each
    region on detached copies of its inputs), whose ``.grad`` the profiler counts as GRADIENT
    beside the parameters'."""


def summed(output: torch.Tensor) -> torch.Tensor:
    return output.sum()


def hf_loss(output) -> torch.Tensor:
    return output.loss


# GPT-2's shape (nanoGPT, the wte/lm_head tie counted once), narrowed: C=64, 2 layers, V=256.
GPT_SMALL = GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=2, n_embd=64)
_C = 64
_GPT_LAYER = (2 * _C                      # ln_1 weight and bias
              + _C * 3 * _C + 3 * _C      # c_attn
              + _C * _C + _C              # attn.c_proj
              + 2 * _C                    # ln_2
              + _C * 4 * _C + 4 * _C      # c_fc
              + 4 * _C * _C + _C)         # mlp.c_proj
GPT_PARAMS = 256 * _C + 64 * _C + 2 * _GPT_LAYER + 2 * _C  # wte (= lm_head), wpe, blocks, ln_f
GPT_TENSORS = 2 + 2 * 12 + 2  # wte, wpe; 12 per block; ln_f's two


def gpt() -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    return GPT(GPT_SMALL), (torch.randint(0, 256, (2, 64)),), {}


# A 4-layer Llama (transformers), hidden 64, 4 heads of 16, 2 KV heads, MLP 128, vocab 256.
_H, _KV, _I, _V = 64, 2 * 16, 128, 256
_LLAMA_LAYER = _H * _H + 2 * _H * _KV + _H * _H + 3 * _H * _I + 2 * _H  # q, k+v, o, MLP, norms
LLAMA_PARAMS = _V * _H + 4 * _LLAMA_LAYER + _H + _H * _V  # embed, layers, norm, untied lm_head
LLAMA_TENSORS = 1 + 4 * 9 + 1 + 1


def llama() -> tuple[nn.Module, tuple, dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=_V, hidden_size=_H, intermediate_size=_I,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    ids = torch.randint(0, _V, (2, 32))
    return LlamaForCausalLM(config), (), {"input_ids": ids, "labels": ids}


def llama_root_params(tp: int) -> int:
    """The Llama's parameters outside its layers on one tensor-parallel rank of ``tp``:
    transformers 5 shards the input embedding on the vocabulary (``embedding_rowwise``,
    transformers/distributed/mixin.py) and the head by its outputs (``colwise_gather_output``),
    the final norm whole."""
    return _V // tp * _H + _H + _V // tp * _H


def llama_layer_params(tp: int) -> int:
    """One Llama layer's parameters on one tensor-parallel rank of ``tp``, by the config's
    ``base_model_tp_plan``: q, k, v, gate and up split by their output rows (colwise), o and
    down by their input columns (rowwise), the two norms whole."""
    return (_H // tp * _H + 2 * (_KV // tp) * _H + _H * (_H // tp)
            + 2 * (_I // tp) * _H + _H * (_I // tp) + 2 * _H)


def llama_rank_params(tp: int) -> int:
    """The Llama's parameters on one tensor-parallel rank of ``tp``."""
    return llama_root_params(tp) + 4 * llama_layer_params(tp)


# A 2-layer Mixtral (transformers), the Llama's attention, 4 experts of MLP 128, top-2 routing;
# transformers' default grouped_mm experts (their weights fused: gate_up_proj, down_proj).
_E = 4
_MIXTRAL_LAYER = (_H * _H + 2 * _H * _KV + _H * _H  # q, k+v, o
                  + _H * _E                         # the router (mlp.gate), no bias
                  + _E * 2 * _I * _H + _E * _H * _I  # the experts' gate_up_proj, down_proj
                  + 2 * _H)                         # norms
MIXTRAL_PARAMS = _V * _H + 2 * _MIXTRAL_LAYER + _H + _H * _V
MIXTRAL_TENSORS = 1 + 2 * 9 + 1 + 1


def mixtral() -> tuple[nn.Module, tuple, dict]:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=_V, hidden_size=_H, intermediate_size=_I,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=_E, num_experts_per_tok=2,
                           max_position_embeddings=128)
    ids = torch.randint(0, _V, (2, 32))
    return MixtralForCausalLM(config), (), {"input_ids": ids, "labels": ids}


class BasicBlock(nn.Module):
    """ResNet's basic block (He et al. 2015, fig. 2): two 3x3 conv-BN, the identity added."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + x)


class SmallResNet(nn.Module):
    """A ResNet's shape, narrowed: a 3x3 stem of 16 channels with batch norm, two basic
    blocks, global average pooling, a 10-way classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(BasicBlock(16), BasicBlock(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.bn(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


_BLOCK = 2 * (16 * 16 * 9 + 2 * 16)  # two convs without bias, two batch norms' weight and bias
RESNET_PARAMS = 3 * 16 * 9 + 2 * 16 + 2 * _BLOCK + 16 * 10 + 10
RESNET_TENSORS = 1 + 2 + 2 * 6 + 2


def resnet() -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    return SmallResNet(), (torch.randn(4, 3, 32, 32),), {}


class CheckpointedMLP(nn.Module):
    """An input projection, then four residual MLP blocks, each under torch.utils.checkpoint:
    the forward keeps each block's input only, the backward reruns the block. The reentrant
    variant differentiates only a region whose input needs a gradient: the projection's
    output does."""

    def __init__(self, reentrant: bool, width: int = 64) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.proj = nn.Linear(width, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                          nn.Linear(4 * width, width)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=self.reentrant)
        return x


_W = 64
CHECKPOINTED_PARAMS = _W * _W + _W + 4 * (2 * _W + _W * 4 * _W + 4 * _W + 4 * _W * _W + _W)
CHECKPOINTED_TENSORS = 2 + 4 * 6


def checkpointed(reentrant: bool) -> Callable[[], tuple[nn.Module, tuple, dict]]:
    def build() -> tuple[nn.Module, tuple, dict]:
        torch.manual_seed(0)
        return CheckpointedMLP(reentrant), (torch.randn(8, 128, _W),), {}
    return build


CASES = {
    "gpt2-shaped": Case(gpt, summed, GPT_PARAMS, GPT_TENSORS),
    "llama-4-layers": Case(llama, hf_loss, LLAMA_PARAMS, LLAMA_TENSORS),
    "mixtral-2-layers": Case(mixtral, hf_loss, MIXTRAL_PARAMS, MIXTRAL_TENSORS),
    "resnet-shaped-batchnorm": Case(resnet, summed, RESNET_PARAMS, RESNET_TENSORS),
    "checkpointed-mlp": Case(checkpointed(reentrant=False), summed, CHECKPOINTED_PARAMS,
                             CHECKPOINTED_TENSORS),
    "reentrant-checkpointed-mlp": Case(checkpointed(reentrant=True), summed,
                                       CHECKPOINTED_PARAMS, CHECKPOINTED_TENSORS,
                                       inner_leaves=True),
}


def command_factory(build: Callable[[], tuple[nn.Module, tuple, dict]]
                    ) -> Callable[[], tuple[nn.Module, tuple]]:
    """``build`` as the command's MODEL factory takes it: (model, (input_ids,)), no labels."""
    def factory() -> tuple[nn.Module, tuple]:
        model, _, kwargs = build()
        return model, (kwargs["input_ids"],)
    return factory


mixtral_ids, llama_ids = command_factory(mixtral), command_factory(llama)
