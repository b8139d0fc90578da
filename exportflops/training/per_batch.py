"""`flops_per_batch`: one analysis, then each step's FLOPs read off its batch's sizes.

The analysis (`exportflops.analyze`, train mode by default) is made symbolic in the batch and
sequence sizes, so its counts are polynomials in them (`exportflops.training.terms`). Calling
the result on a batch reads the tensors' sizes (and, where the batch has them, its padding mask
and packed documents: `exportflops.training.batches`) and evaluates the polynomials: nothing
is exported, hooked or run in the step.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Literal

import sympy
import torch
from torch.export import Dim

from ..aggregate import Counted, build_report
from ..api import count_call
from ..capture.checkpointed import checkpointed_modules
from ..count.recompute import may_checkpoint
from ..capture.value_read_sizes import on_meta, value_read_sizes
from ..count.backward import RECOMPUTED
from ..errors import InputError
from ..records import FLOPS_PER_MAC, Report
from ..records.names import ancestors
from ..records.symbolic import parse_count, size_symbol
from ..records.training import DocumentFlops, StepFlops
from ..torch_internals import pytree
from .batches import (
    packs_documents, rows_of, var_keyword_of, without_flash_metadata, without_varlen)
from .checks import check_rows, check_sizes, dtype_error, dtype_kind, position_limit
from .terms import step_count

#: The dynamic sizes `flops_per_batch` makes, and the names it reads a step's sizes by.
BATCH, SEQ = "batch", "seq"


class FlopsPerBatch:
    """The FLOPs of a step as a function of its batch: ``fpb(batch)`` is its ``model_flops``.

    Call it with the arguments the model's forward takes (``fpb(ids)``, ``fpb(**inputs)``), or
    with ``seqlens=[L1, L2, ...]`` for one row packing documents of these lengths."""

    def __init__(self, report: Report, signature: inspect.Signature,
                 dims: list[tuple[str, tuple, int, str]], *, batch: str, seq: str | None,
                 routed: dict[str, Any], checkpointed: frozenset[str] = frozenset(),
                 counted: Counted, positions: tuple[int, str] | None = None) -> None:
        self.report = report
        """The analysis, symbolic in the sizes: per module and operator detail lives here."""
        self.counted = counted
        """What ``report`` is built from (`build_report`), for a report of the same call on a
        rank at some sizes (`exportflops.parallel.context.ranks.context_rank_report`)."""
        self.batch, self.seq = batch, seq
        self._signature = signature
        self._dims = dims
        self._tensor_arguments = {name for name, *_ in dims}
        self._positions = positions
        self._var_keyword = var_keyword_of(signature)
        self._named = {name for name, p in signature.parameters.items()
                       if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        # Recompute the graph records (reentrant checkpointing, the checkpoint higher-order
        # ops), and the forward of regions a non-reentrant checkpoint reruns, which it does not.
        recorded = [n.cost for n in report.nodes if n.note.startswith(RECOMPUTED)]
        rerun = [n.cost for n in report.nodes if n.phase == "forward"
                 and not checkpointed.isdisjoint(ancestors(n.module))]
        self._counts = {}
        for field in ("flops", "macs"):
            in_graph = _summed(recorded, field)
            recompute = in_graph + _summed(rerun, field)
            total = parse_count(getattr(report.total, field))
            backward = parse_count(getattr(report.backward, field))
            for part, expr in (("forward", total - backward),
                               ("backward", backward - in_graph),
                               ("recompute", recompute), ("model", total - in_graph)):
                self._counts[field, part] = step_count(_routed(expr, routed), batch, seq)
        self._size_names = {name for count in self._counts.values() for name in count.names}
        self.complete = not report.uncounted
        """False when the analysis left ops uncounted (``report.uncounted``)."""

    def __call__(self, *args: Any, seqlens: list[int] | None = None, **kwargs: Any) -> int:
        """The step's ``model_flops``: useful FLOPs without recompute."""
        sizes, rows = self._read(args, kwargs, seqlens)
        model = self._counts["flops", "model"]
        if all(row == [sizes.get(self.seq)] for row in rows):
            return model.at(sizes)  # every row whole: the useful count is the executed one
        return model.useful(sizes, rows, self.batch, self.seq)

    def step(self, *args: Any, seqlens: list[int] | None = None, **kwargs: Any) -> StepFlops:
        """Every count of the step on this batch (`StepFlops`)."""
        sizes, rows = self._read(args, kwargs, seqlens)
        useful = {key: count.useful(sizes, rows, self.batch, self.seq)
                  for key, count in self._counts.items()}
        executed = {key: count.at(sizes) for key, count in self._counts.items()}
        tokens = sum(map(sum, rows)) if self.seq else sizes[self.batch]
        packed = seqlens is not None or any(len(row) > 1 for row in rows)
        model = useful["flops", "model"]
        return StepFlops(
            model_flops=model, hardware_flops=model + useful["flops", "recompute"],
            executed_flops=executed["flops", "model"] + executed["flops", "recompute"],
            recompute_flops=executed["flops", "recompute"],
            forward_flops=useful["flops", "forward"],
            matmul_flops=FLOPS_PER_MAC * useful["macs", "model"], tokens=tokens,
            padded_tokens=(sizes[self.batch] * sizes[self.seq] - tokens) if self.seq else 0,
            sizes=sizes, complete=self.complete,
            documents=[self._document(sizes, length) for row in rows for length in row]
            if packed else [])

    def rows(self, *args: Any, seqlens: list[int] | None = None,
             **kwargs: Any) -> tuple[dict[str, int], list[list[int]]]:
        """The batch's dynamic sizes, and each row's documents' lengths (one per unpacked
        row: its tokens without padding), as ``step`` reads them."""
        return self._read(args, kwargs, seqlens)

    def resized(self, args: tuple, kwargs: dict, **sizes: int) -> tuple[tuple, dict]:
        """The batch ``args``/``kwargs`` cut to ``sizes`` (``seq=512``): each tensor's first
        positions along its dims of these sizes, as the forward takes them; a size is no
        larger than the batch's."""
        kwargs = kwargs or {}
        marked = {(name, path): dims for name, path, dims, _ in self._dims}

        def cut(name, path, leaf):
            dims = marked.get((name, tuple(path)))
            if not isinstance(leaf, torch.Tensor) or dims is None:
                return leaf
            for dim, (_, symbol) in enumerate(dims):
                if symbol in sizes:
                    if not 0 < sizes[symbol] <= leaf.shape[dim]:
                        raise InputError(f"{_where(name, path)}: {symbol}={sizes[symbol]} is "
                                         f"not in 1..{leaf.shape[dim]}, its size.")
                    leaf = leaf.narrow(dim, 0, sizes[symbol])
            return leaf.clone()

        cut_arguments = {name: pytree.tree_map_with_path(functools.partial(cut, name), value)
                         for name, value in self._bound(args, kwargs).items()}
        return _as_called(self._signature, cut_arguments, len(args), kwargs)

    def _document(self, sizes: dict[str, int], length: int) -> DocumentFlops:
        return DocumentFlops(length=length, flops=self._counts["flops", "model"].document(
            sizes, length, self.batch, self.seq))

    def _read(self, args: tuple, kwargs: dict, seqlens: list[int] | None):
        """The batch's sizes, and each row's documents' lengths, checked
        (`exportflops.training.checks`) whichever way the batch came in."""
        if seqlens is not None:
            sizes, rows = self._packed(seqlens, args, kwargs)
            packed = True
        else:
            arguments, varlen = without_varlen(self._var_keyword,
                                              self._bound(args, kwargs))
            sizes = self._sizes(arguments)
            check_sizes(sizes, self.report.model)
            if self.seq is None:
                rows, packed = [[1]] * sizes[self.batch], False
            else:
                arguments = {**arguments, **varlen}
                rows = rows_of(arguments, sizes[self.batch], sizes[self.seq])
                packed = packs_documents(arguments)
        check_rows(sizes, rows, seq=self.seq, packed=packed, limit=self._positions,
                   model=self.report.model)
        return sizes, rows

    def _packed(self, seqlens: list[int], args: tuple, kwargs: dict):
        if args or kwargs:
            raise InputError("fpb(seqlens=[...]) describes the batch by itself: call it "
                             "without the batch's tensors, or with the tensors alone.")
        if self.seq is None:
            raise InputError("seqlens= needs a sequence size, but this analysis has none: "
                             "pass seq_dim= naming the Dim of the sequence.")
        lengths = list(seqlens)
        if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1
                              for n in lengths):
            raise InputError(f"seqlens must be a non-empty list of positive ints (a document "
                             f"of no tokens runs nothing), got {seqlens!r}")
        sizes = {self.batch: 1, self.seq: sum(lengths)}
        missing = self._size_names - sizes.keys()
        if missing:
            raise InputError(f"seqlens= sets the batch and the sequence only; the counts also "
                             f"depend on {sorted(missing)}: call fpb with the batch's tensors.")
        return sizes, [lengths]

    def _bound(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if not args and self._named.issuperset(kwargs):
            return kwargs  # fpb(**batch) of named arguments: nothing to bind
        try:
            return self._signature.bind_partial(*args, **kwargs).arguments
        except TypeError as error:
            raise InputError(f"the batch does not match {self.report.model}.forward"
                             f"{self._signature}: {error}. Call fpb with the arguments the "
                             f"forward takes (fpb(**batch) for a dict).") from None

    def _sizes(self, arguments: dict[str, Any]) -> dict[str, int]:
        given = {name for name, value in arguments.items() if _holds_tensor(value)}
        if given != self._tensor_arguments:
            missing, extra = self._tensor_arguments - given, given - self._tensor_arguments
            raise InputError(
                f"the batch's tensors are not the example's: "
                f"{'missing ' + ', '.join(sorted(missing)) if missing else ''}"
                f"{'; ' if missing and extra else ''}"
                f"{'not in the example ' + ', '.join(sorted(extra)) if extra else ''}. The "
                f"forward runs other code with other inputs (labels add the loss): analyze "
                f"with an example of the batches you train on.")
        sizes: dict[str, int] = {}
        for name, path, dims, kind in self._dims:
            value = arguments.get(name)
            for key in path:
                value = None if value is None else key.get(value)
            if not isinstance(value, torch.Tensor):
                continue
            if dtype_kind(value) != kind:
                raise dtype_error(_where(name, path), value, kind)
            shape = value.shape
            if len(shape) != len(dims):
                raise InputError(f"{_where(name, path)} of the batch has {len(shape)} dims "
                                 f"where the example's had {len(dims)}.")
            for dim, (actual, (size, symbol)) in enumerate(zip(shape, dims)):
                if symbol is None:
                    if actual != size:
                        raise InputError(
                            f"{_where(name, path)} of the batch has size {actual} in dim {dim} "
                            f"where the analysis fixed it at the example's {size}: mark it "
                            f"dynamic (dynamic_shapes=) when flops_per_batch analyzes.")
                elif sizes.setdefault(symbol, actual) != actual:
                    raise InputError(
                        f"the batch gives {symbol} two values ({sizes[symbol]} and {actual} at "
                        f"{_where(name, path)} dim {dim}): its tensors' sizes must agree as "
                        f"in the example.")
        missing = self._size_names - sizes.keys()
        if missing:
            raise InputError(f"the batch sets no size for {sorted(missing)}: pass the "
                             f"arguments the example had: {sorted(self._tensor_arguments)}.")
        return sizes



def _as_called(signature: inspect.Signature, arguments: dict[str, Any], positional: int,
               kwargs: dict) -> tuple[tuple, dict]:
    """``arguments`` (bound by name) as the call passed them: its first ``positional`` as
    positional arguments, the rest by the keywords of ``kwargs``."""
    args: list[Any] = []
    for parameter in signature.parameters.values():
        if len(args) >= positional:
            break
        if parameter.kind is parameter.VAR_POSITIONAL:
            args.extend(arguments.get(parameter.name, ()))
        else:
            args.append(arguments[parameter.name])
    extra = next((arguments.get(p.name, {}) for p in signature.parameters.values()
                  if p.kind is p.VAR_KEYWORD), {})
    return tuple(args), {key: arguments[key] if key in arguments else extra[key]
                         for key in kwargs}


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value))


def _summed(costs: list, field: str) -> sympy.Expr:
    return sum((parse_count(getattr(cost, field)) for cost in costs), sympy.Integer(0))


def _where(name: str, path: tuple) -> str:
    return name + "".join(str(key) for key in path)


def flops_per_batch(model: torch.nn.Module, example_args: Any = (),
                    example_kwargs: dict | None = None, *,
                    mode: Literal["forward", "train"] = "train", dynamic_shapes: Any = None,
                    batch_dim: str = BATCH, seq_dim: str | None = SEQ,
                    routed_per_token: int | None = None, formulas: Any = None,
                    progress: bool = False) -> FlopsPerBatch:
    """One analysis of ``model`` on an example batch, returned as a function of any batch.

    The example's first tensor's dim 0 is the batch and the first 2-D integer tensor's dim 1
    (token ids) the sequence: every input's dim 0 or 1 of those sizes becomes a dynamic size
    named ``batch`` or ``seq`` (give the example distinct sizes). ``dynamic_shapes`` marks them
    yourself instead, with ``batch_dim`` and ``seq_dim`` naming which Dims they are.
    A model that routes tokens by value (a mixture of experts) has sizes read from values
    (tokens per expert); dropless top-k routing sends each token to the same number of experts
    whatever the routing, so their sum per token is a constant: measured on the example's run
    (real tensors), or given as ``routed_per_token`` (top_k x the routed layers) on meta.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"flops_per_batch takes an nn.Module, got {type(model).__name__}: "
                         f"a saved or exported program has no batch to read sizes from.")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    signature = inspect.signature(model.forward)
    kwargs = without_flash_metadata(model, signature, dict(example_kwargs or {}))
    if dynamic_shapes is None:
        args, kwargs, dynamic_shapes, has_seq = _marked(model, signature, args, kwargs)
        batch_dim, seq_dim = BATCH, (SEQ if has_seq else None)
    counted = count_call(model, args, kwargs, dynamic_shapes=dynamic_shapes, mode=mode,
                         formulas=formulas, progress=progress)
    report = build_report(counted)
    names = {s.name for s in report.symbols}
    for role, name in (("batch_dim", batch_dim), ("seq_dim", seq_dim)):
        if name is not None and name not in names:
            raise InputError(f"{role}={name!r} is no dynamic size of the analysis of "
                             f"{type(model).__name__} (its sizes: {sorted(names)}): name a Dim "
                             f"of dynamic_shapes, or one export kept dynamic.")
    arguments = signature.bind_partial(*args, **kwargs).arguments
    dims = _dims(arguments, dynamic_shapes, names)
    routed = _routing(report, model, args, kwargs, routed_per_token, batch_dim, seq_dim)
    # Only a model that may checkpoint is searched (`may_checkpoint`): a failed search of one
    # that never does would warn of a recompute there is none of.
    checkpointed = (checkpointed_modules(model, args, kwargs)
                    if mode == "train" and may_checkpoint(model) else frozenset())
    if checkpointed is None:
        warnings.warn(f"{type(model).__name__} did not run eagerly on fake tensors, which finds "
                      f"the modules non-reentrant checkpointing reruns: flops_per_batch leaves "
                      f"their recompute out (analyze at fixed sizes counts it).", stacklevel=2)
        checkpointed = frozenset()
    if report.uncounted:
        warnings.warn(f"{len(report.uncounted)} ops of {type(model).__name__} are uncounted "
                      f"(report.uncounted): flops_per_batch's counts are lower bounds "
                      f"(StepFlops.complete is False).", stacklevel=2)
    return FlopsPerBatch(report, signature, dims, batch=batch_dim, seq=seq_dim, routed=routed,
                         checkpointed=checkpointed, counted=counted,
                         positions=position_limit(model))


def _marked(model, signature, args: tuple, kwargs: dict):
    """The example with ``batch`` and ``seq`` marked dynamic wherever its sizes appear, each
    example size of 1 doubled (export fixes a size of 1)."""
    leaves = [leaf for leaf in pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor)]
    if not leaves or leaves[0].dim() == 0:
        raise InputError(f"flops_per_batch needs an example batch of tensors for "
                         f"{type(model).__name__}.forward, its dim 0 the batch.")
    tokens = next((leaf for leaf in leaves if leaf.dim() == 2 and not leaf.is_floating_point()
                   and not leaf.is_complex()), None)
    batch, seq = leaves[0].shape[0], (tokens.shape[1] if tokens is not None else None)
    if seq is not None and batch == seq and batch > 1:
        raise InputError(f"the example's batch and sequence sizes are both {batch}: give them "
                         f"distinct sizes so each input's dims can be told apart.")
    sizes = {0: (batch, BATCH), 1: (seq, SEQ)}

    def grown(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        for dim, (size, _) in sizes.items():
            if size == 1 and leaf.dim() > dim and leaf.shape[dim] == 1:
                leaf = torch.cat([leaf, leaf], dim=dim)
        return leaf

    def spec(leaf):
        if not isinstance(leaf, torch.Tensor):
            return None
        marks = {dim: Dim(name) for dim, (size, name) in sizes.items()
                 if size is not None and leaf.dim() > dim and leaf.shape[dim] == size}
        return marks or None

    arguments = signature.bind_partial(*args, **kwargs).arguments
    shapes = {name: pytree.tree_map(spec, value) for name, value in arguments.items()}
    args, kwargs = pytree.tree_map(grown, (args, kwargs))
    return args, kwargs, _shared_dims(shapes), seq is not None


def _shared_dims(shapes: dict) -> dict:
    """One ``Dim`` object per name: export ties dims that are the same object."""
    made: dict[str, Dim] = {}

    def one(value):
        if isinstance(value, dict):
            return {dim: made.setdefault(d.__name__, d) for dim, d in value.items()}
        return value

    return {name: pytree.tree_map(one, value, is_leaf=lambda v: isinstance(v, dict)
                                  and all(isinstance(k, int) for k in v))
            for name, value in shapes.items()}


def _dims(arguments: dict, dynamic_shapes: Any, names: set[str]) -> list:
    """For each tensor of the example: (argument, key path inside it, per dim its example
    size and the dynamic size's name (None where the analysis fixed it), its dtype's kind)."""
    if not isinstance(dynamic_shapes, dict):
        dynamic_shapes = dict(zip(arguments, dynamic_shapes))
    is_spec = lambda v: v is None or isinstance(v, dict) and all(isinstance(k, int) for k in v)  # noqa: E731
    found = []
    for name, value in arguments.items():
        specs = dict(pytree.tree_leaves_with_path(dynamic_shapes.get(name), is_leaf=is_spec))
        for path, leaf in pytree.tree_leaves_with_path(value):
            if isinstance(leaf, torch.Tensor):
                spec = specs.get(path) or {}
                named = {dim % leaf.dim(): getattr(d, "__name__", None) for dim, d in spec.items()}
                found.append((name, tuple(path), [
                    (size, named.get(dim) if named.get(dim) in names else None)
                    for dim, size in enumerate(leaf.shape)], dtype_kind(leaf)))
    return found


def _routing(report: Report, model, args: tuple, kwargs: dict, given: int | None,
             batch: str, seq: str | None) -> dict[str, Any]:
    """The per-token sum of the sizes read from values, as a substitution for them."""
    read = [s.name for s in report.symbols if s.data_dependent]
    if not read:
        return {}
    sizes = [name for name in (batch, seq) if name]
    tokens_symbol = sympy.Mul(*(size_symbol(name) for name in sizes))
    if given is None:
        if on_meta((args, kwargs)):
            raise InputError(
                f"{type(model).__name__} reads {len(read)} sizes from its inputs' values "
                f"({', '.join(read)}: tokens routed to each expert); on meta they have no "
                f"value: pass routed_per_token= (top_k x the routed layers), or an example "
                f"of real tensors.")
        lengths = value_read_sizes(model, args, kwargs)
        if len(lengths) != len(read):
            raise InputError(
                f"{type(model).__name__}'s run read {len(lengths)} sizes from values where its "
                f"graph has {len(read)} ({', '.join(read)}): pass routed_per_token=.")
        tokens = int(tokens_symbol.subs({size_symbol(name): _example(report, name)
                                         for name in sizes}))
        per_token = sympy.Rational(sum(lengths), tokens)
    else:
        per_token = sympy.Integer(given)
    return {"symbols": [size_symbol(name) for name in read],
            "sum": per_token * tokens_symbol}


def _example(report: Report, name: str) -> int:
    return next((s.example for s in report.symbols if s.name == name), 1)


def _routed(expression: Any, routed: dict[str, Any]) -> Any:
    """``expression`` with the sizes read from values replaced by their known sum: possible
    where each enters with the same coefficient (every expert the same shape)."""
    expr = sympy.expand(sympy.sympify(parse_count(expression)))
    if not routed:
        return expr
    symbols = routed["symbols"]
    coefficients = {expr.coeff(u) for u in symbols}
    rest = expr.subs({u: 0 for u in symbols})
    if len(coefficients) != 1 or sympy.expand(rest + sum(expr.coeff(u) * u for u in symbols)
                                              - expr) != 0:
        raise InputError(
            f"the sizes read from values ({', '.join(map(str, symbols))}) enter the counts "
            f"with different costs, so their sum alone does not give a step's FLOPs: evaluate "
            f"the analysis at each size (report.evaluate) instead.")
    return rest + coefficients.pop() * routed["sum"]
