"""The values the flags take, parsed from their text: --input's shapes and dtypes, --kwargs'
JSON, --dynamic's places, --sweep's points, the counts of --seqlens and --routing; each
refusal a usage error naming the flag and the value given."""

from __future__ import annotations

import argparse
import json
import math

from ..errors import UsageError

# torch holds a size, an element count and a storage's bytes as int64: a larger size fails to
# unpack ("Overflow when unpacking long long"), larger bytes fail in ATen's computeStorageNbytes
# (aten/src/ATen/EmptyTensor.cpp: "Storage size calculation overflowed"), even on meta.
INT64_MAX = 2**63 - 1


def counts(text: str, *, least: int, example: str) -> list[int]:
    """--seqlens' lengths, --routing's token copies per expert: counts >= ``least``."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"takes counts >= {least} separated by commas "
                                         f"({example}), got {text!r}")
    return values


def keyword_inputs(text: str) -> dict:
    """--kwargs' JSON object: forward's keyword arguments."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--kwargs is not valid JSON ({error}): pass an object such as "
                         f"'{{\"use_cache\": false}}'.") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--kwargs must be a JSON object of keyword arguments, got "
                         f"{type(kwargs).__name__}.")
    return kwargs


def sweep_points(texts: list[str]) -> dict[str, list[int]]:
    """--sweep's values of each size (``seq=512,1024``), the sizes moving together."""
    sweeps = [_parse_sweep(text) for text in texts]
    points = dict(sweeps)
    if len(points) < len(sweeps):
        raise UsageError("a size is swept twice: give each NAME one --sweep NAME=V[,V...].")
    if points and len({len(v) for v in points.values()}) > 1:
        raise UsageError("several --sweep move together, element by element: give each as "
                         "many values.")
    return points


def dynamic_dim(text: str) -> tuple[str, tuple[int, int]]:
    from ..capture.dims import NAMED_DIMS

    name, _, where = text.strip().partition("=")
    if not where:
        if name not in NAMED_DIMS:
            raise UsageError(f"--dynamic {name}: name batch or seq, or give the place as "
                             f"NAME=ARG:DIM (positional input ARG, its dim DIM).")
        return name, NAMED_DIMS[name]
    arg, _, dim = where.partition(":")
    if not (name.isidentifier() and arg.isdigit() and dim.lstrip("-").isdigit()):
        raise UsageError(f"--dynamic {text!r}: write NAME=ARG:DIM, e.g. tokens=0:1.")
    return name, (int(arg), int(dim))


def _parse_sweep(text: str) -> tuple[str, list[int]]:
    name, _, values = text.partition("=")
    try:
        points = [int(v) for v in values.split(",")]
    except ValueError:
        points = []
    if not name.isidentifier() or not points or min(points) < 1:
        raise UsageError(f"--sweep {text!r}: write NAME=V[,V...] with positive integers, e.g. "
                         f"seq=512,1024,2048.")
    return name, points


def input_shape(text: str):
    """``1,3,224,224`` or ``1,1024:int64`` -> (sizes, torch dtype)."""
    import torch

    shape, _, dtype_name = text.partition(":")
    try:
        sizes = [int(s) for s in shape.split(",")]
    except ValueError:
        raise UsageError(f"--input {text!r}: sizes must be integers separated by commas, "
                         f"optionally followed by :dtype, e.g. 1,3,224,224 or 1,1024:int64."
                         ) from None
    if any(s < 1 for s in sizes):
        raise UsageError(f"--input {text!r}: sizes must be at least 1, got {min(sizes)}.")
    if max(sizes) > INT64_MAX:
        raise UsageError(f"--input {text!r}: size {max(sizes)} is past {INT64_MAX} "
                         f"(2**63 - 1), the largest a size can be: torch holds sizes as "
                         f"signed 64-bit integers.")
    dtype = getattr(torch, dtype_name or "float32", None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"--input {text!r}: unknown dtype {dtype_name!r}; use a torch dtype "
                         f"name such as float32, bfloat16, float16 or int64.")
    nbytes = math.prod(sizes) * dtype.itemsize
    if nbytes > INT64_MAX:
        raise UsageError(f"--input {text!r}: {nbytes:,} bytes, past {INT64_MAX:,} (2**63 - 1), "
                         f"the most a tensor can hold even on meta: torch counts a tensor's "
                         f"bytes as a signed 64-bit integer.")
    return sizes, dtype
