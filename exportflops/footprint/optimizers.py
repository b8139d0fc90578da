"""The optimizer and the precision of a training step, built over the fake copy's parameters.

An optimizer is a name (`OPTIMIZERS`) or the user's ``torch.optim.Optimizer``: its class and
its param_groups' hyperparameters are rebuilt over the fake parameters (`Rebuilt`), so the
states are what that class allocates; its own tensors are never read. A precision
(`PRECISIONS`) sets the dtypes of parameters, gradients and states; ``bf16-master`` steps an
fp32 master copy (`MasterWeights`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError
from ..torch_internals import pytree

#: The optimizers a training step can run, by name (their defaults: the state they allocate
#: does not depend on the learning rate).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop}

#: The precisions of a training step. ``32-true``, ``bf16-mixed`` and ``bf16-true`` are
#: Lightning's names (https://lightning.ai/docs/fabric/latest/fundamentals/precision.html);
#: ``*-true``: every parameter, gradient and state in that dtype. ``bf16-master`` is ours, for
#: the scheme of Megatron-LM's bf16 optimizer and DeepSpeed's
#: (deepspeed/runtime/bf16_optimizer.py): bf16 parameters, gradients and activations, an fp32
#: master copy and fp32 states, fp32 gradients for the step;
#: Megatron's table (https://docs.nvidia.com/megatron-core/developer-guide/latest/
#: distrib_optimizer.html, "float16 param, fp32 grads": 18 bytes per parameter with Adam) is
#: 2 (parameter) + 4 (gradient) + 4 (master) + 8 (two moments). ``bf16-mixed`` is Lightning's
#: autocast: fp32 parameters, gradients and states; each forward and loss under
#: ``torch.autocast(dtype=torch.bfloat16)``, whose ops' casts are temporaries or activations.
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "bf16-master")


@dataclass(frozen=True)
class Rebuilt:
    """A user's optimizer, as what rebuilds it: its class, and per param group the positions
    of its parameters in ``model.parameters()`` and its hyperparameters."""

    kind: type[torch.optim.Optimizer]
    groups: tuple[tuple[tuple[int, ...], dict[str, Any]], ...]
    defaults: dict[str, Any]

    def build(self, parameters: Sequence[torch.Tensor], model: str) -> torch.optim.Optimizer:
        groups = [{**hyper, "params": [parameters[i] for i in positions]}
                  for positions, hyper in self.groups]
        try:
            return self.kind(groups, **self.defaults)
        except (TypeError, ValueError) as error:
            raise InputError(
                f"the optimizer {self.kind.__qualname__} given for {model} cannot be rebuilt "
                f"from its param_groups and defaults ({type(error).__name__}: {error}); pass "
                f"optimizer= one of {', '.join(OPTIMIZERS)} with optimizer_options=.") from None


def rebuilt(optimizer: torch.optim.Optimizer, model: torch.nn.Module, name: str) -> Rebuilt:
    """``optimizer`` (over ``model``'s parameters) as what rebuilds it over a copy of them."""
    positions = {id(p): i for i, p in enumerate(model.parameters())}
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        foreign = [tuple(p.shape) for p in group["params"] if id(p) not in positions]
        if foreign:
            raise InputError(
                f"{type(optimizer).__qualname__}.param_groups[{g}] holds {len(foreign)} "
                f"tensor(s) that are not parameters of the {name} given (shapes "
                f"{foreign[:3]}): build the optimizer over that model's parameters(), or pass "
                f"optimizer= by name.")
        hyper = {key: _hyperparameter(value, key, optimizer, name)
                 for key, value in group.items() if key != "params"}
        groups.append((tuple(positions[id(p)] for p in group["params"]), hyper))
    defaults = {key: _hyperparameter(value, key, optimizer, name)
                for key, value in optimizer.defaults.items()}
    return Rebuilt(type(optimizer), tuple(groups), defaults)


def _hyperparameter(value: Any, key: str, optimizer: torch.optim.Optimizer, name: str) -> Any:
    """A hyperparameter as the rebuilt optimizer takes it: a tensor's value as a float (the
    state a class allocates does not depend on the learning rate's type unless capturable)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.numel() != 1 or value.device.type == "meta":
        raise InputError(
            f"{type(optimizer).__qualname__}'s hyperparameter {key!r} for {name} is a tensor "
            f"of shape {tuple(value.shape)} on {value.device}: memory() reads hyperparameters "
            f"as numbers; give {key} as a float.")
    return value.item()


def optimizer_name(optimizer: str | torch.optim.Optimizer) -> str:
    """The report's name of ``optimizer``: its name, or the class of an instance."""
    return optimizer if isinstance(optimizer, str) else type(optimizer).__qualname__


class MasterWeights:
    """``bf16-master``'s step, as Megatron-LM's and DeepSpeed's bf16 optimizers run it: each
    bf16 gradient becomes the fp32 gradient of an fp32 master copy of its parameter (and is
    dropped), the optimizer steps the masters, the bf16 parameters are copied from them. Its
    ``state`` holds each master with that master's optimizer states."""

    def __init__(self, parameters: Sequence[torch.Tensor],
                 build: Callable[[Sequence[torch.Tensor]], torch.optim.Optimizer]) -> None:
        self.parameters = list(parameters)
        self.masters = [p.detach().float() for p in self.parameters]
        self.optimizer = build(self.masters)

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        return {m: {"master": m, **self.optimizer.state.get(m, {})} for m in self.masters}

    @torch.no_grad()
    def gradients(self) -> list[torch.Tensor]:
        """Each bf16 gradient made the fp32 gradient of its master (Megatron's ``main_grad``)
        and dropped, one parameter after another: the fp32 gradients."""
        for parameter, master in zip(self.parameters, self.masters):
            if parameter.grad is not None:
                master.grad = parameter.grad.float()
                parameter.grad = None
        return [m.grad for m in self.masters if m.grad is not None]

    @torch.no_grad()
    def step(self) -> None:
        self.gradients()
        self.optimizer.step()
        for parameter, master in zip(self.parameters, self.masters):
            parameter.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for parameter in self.parameters:
            parameter.grad = None


def build_optimizer(optimizer: str | Rebuilt, options: dict | None, model: torch.nn.Module,
                    name: str, precision: str) -> torch.optim.Optimizer | MasterWeights:
    """``optimizer`` over ``model``'s (fake) parameters, in ``precision``."""
    def over(parameters: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        if isinstance(optimizer, Rebuilt):
            return optimizer.build(parameters, name)
        kind = OPTIMIZERS[optimizer]
        try:
            return kind(parameters, **(options or {}))
        except (TypeError, ValueError) as error:
            raise InputError(f"optimizer_options={options!r} for {name}: torch.optim."
                             f"{kind.__name__} refuses them: {error}") from None

    parameters = list(model.parameters())
    return MasterWeights(parameters, over) if precision == "bf16-master" else over(parameters)


def in_precision(model: torch.nn.Module, args: tuple, kwargs: dict, precision: str
                 ) -> tuple[torch.nn.Module, tuple, dict]:
    """The fake ``model`` (in place: its floating parameters and buffers, tied ones kept tied)
    and its floating inputs in ``precision``'s dtype: bf16 but for ``32-true``. Called under
    the fake mode: each cast is a new fake tensor (``model.to`` cannot swap a fake
    parameter, which has weak references)."""
    if precision in ("32-true", "bf16-mixed"):
        return model, args, kwargs
    cast: dict[int, torch.Tensor] = {}

    def bf16(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            return tensor
        if id(tensor) not in cast:
            made = torch.empty(tensor.shape, dtype=torch.bfloat16, device=tensor.device)
            cast[id(tensor)] = (torch.nn.Parameter(made, tensor.requires_grad)
                                if isinstance(tensor, torch.nn.Parameter)
                                else made.requires_grad_(tensor.requires_grad))
        return cast[id(tensor)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for key, tensor in table.items():
                if tensor is not None:
                    table[key] = bf16(tensor)
    def leaf(value: Any) -> Any:
        return bf16(value) if isinstance(value, torch.Tensor) else value
    return model, pytree.tree_map(leaf, args), pytree.tree_map(leaf, kwargs)


def forward_context(precision: str) -> Callable[[], contextlib.AbstractContextManager]:
    """What each forward and loss of the step runs under in ``precision``: ``bf16-mixed``'s
    autocast (on cpu: the fake copy's tensors are fake cpu tensors), else nothing."""
    if precision != "bf16-mixed":
        return contextlib.nullcontext
    return functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
