"""capture.held: every tensor an input holds, in objects pytree does not know, and a copy with
each replaced that leaves the input as it was."""

from __future__ import annotations

import torch

from exportflops.capture.held import copied, tensors_in


class _Layer:  # a cache layer: tensors as plain attributes
    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys
        self.config = {"name": "tensor-free"}


class _Slotted:
    __slots__ = ("tensor", "__private")

    def __init__(self, tensor: torch.Tensor, private: torch.Tensor) -> None:
        self.tensor = tensor
        self.__private = private


def _inputs():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    layer = _Layer(a)
    layer.back = layer  # a cycle through an object holding a tensor
    return (layer, [_Slotted(b, c)], {"mask": d, "again": a, "steps": 3}), (a, b, c, d)


def test_every_tensor_is_found_once_in_attributes_slots_lists_and_dicts():
    inputs, tensors = _inputs()
    assert [id(t) for t in tensors_in(inputs)] == [id(t) for t in tensors]


def test_the_copy_holds_each_replacement_and_the_original_its_tensors():
    inputs, tensors = _inputs()
    calls = []

    def replaced(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor)
        return tensor + 10

    layer, slotted, named = copied(inputs, replaced)
    assert len(calls) == 4  # one call per tensor, a's second reference included
    assert layer.keys is named["again"] and torch.equal(layer.keys, torch.full((2,), 10.0))
    assert layer.back is layer  # the copy's cycle closes on the copy
    assert torch.equal(slotted[0]._Slotted__private, torch.full((2,), 12.0))
    assert layer.config is inputs[0].config  # holding no tensor: shared, not copied
    original, _, original_named = inputs
    assert original.keys is tensors[0] and original.back is original
    assert original_named["mask"] is tensors[3]
