"""The ``exportflops`` command: parse arguments, build the model, analyze, render.

Orchestration only: counting is `analyze`'s, rendering is `render`'s. Exit status 0 on success,
2 when the command cannot run as written (bad arguments, a MODEL that does not resolve, a missing
file or package), 1 when building or analyzing the model fails; each failure prints one
paragraph on stderr, and the traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import logging
import os
import sys
import traceback
from typing import Any

from . import __version__

FORMATS = ("table", "json", "csv", "md")
DEFAULT_VIEWS = ("summary", "tree")
HF_DEFAULT_SEQ_LEN = 128

EXAMPLES_HELP = """\
MODEL is one of:
  a built-in example      gpt2 (GPT-2 124M, nanoGPT), llama, resnet50 (torchvision's ResNet-50)
  pkg.module:factory      a callable in an importable module (the current directory is on the path)
  path/to/file.py:factory a callable defined in a Python file
  path/to/program.pt2     a program saved with torch.export.save (analyzed with its example inputs)
  hf:<model_type>         a Hugging Face model from its default config, offline (needs transformers)

A factory returns a model (then --input gives its inputs) or (model, args). If it takes a
`device` argument it is called with --device; otherwise the model is moved there.

examples:
  exportflops gpt2                                   summary and module tree of GPT-2 124M
  exportflops resnet50 --view top,tree --depth 2     top module types and the tree to depth 2
  exportflops gpt2 --input 4,256:int64 --view operators
  exportflops mypkg.models:build --input 1,3,224,224 --format csv --output resnet.csv
  exportflops ./net.py:Net --input 8,32 --input 8,32:float16 --kwargs '{"scale": 0.5}'
  exportflops saved/model.pt2 --format json --output report.json
  exportflops hf:llama --input 1,512:int64 --strict

exit status: 0 success; 2 the command cannot run as written (arguments, MODEL, missing file or
package); 1 building or analyzing the model failed. --debug adds the traceback.
"""


class UsageError(Exception):
    """The command cannot run as written: exit 2."""


class BuildError(Exception):
    """The user's code failed while importing or building the model: exit 1."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        _check(ns)
        text = _run(ns)
    except UsageError as error:
        return _fail(ns, f"exportflops: error: {error}", 2)
    except BuildError as error:
        return _fail(ns, f"exportflops: could not build {ns.model}: {error}", 1)
    except Exception as error:  # the CLI's boundary: any analysis failure becomes exit 1
        return _fail(ns, f"exportflops: analysis of {ns.model} failed: "
                         f"{type(error).__name__}: {error}", 1)
    if not ns.output:
        sys.stdout.write(text)
        return 0
    try:
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        return _fail(ns, f"exportflops: error: cannot write --output {ns.output!r} "
                         f"({error.strerror}); pass a path in an existing, writable folder, "
                         f"or leave --output out to print the report.", 2)
    print(f"exportflops: wrote {ns.output}", file=sys.stderr)
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """argparse's own errors (a bad option or value), as one paragraph like the others."""
        self.exit(2, f"exportflops: error: {message}; see exportflops --help.\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="exportflops",
        description="FLOPs, MACs and bytes per module and per operator of a PyTorch model, "
                    "counted from its torch.export graph.",
        epilog=EXAMPLES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="what to analyze (see below)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="one positional input of forward(), e.g. 1,3,224,224 or 1,1024:int64 "
                             "(dtype default float32); repeat for several inputs")
    parser.add_argument("--kwargs", metavar="JSON", default=None,
                        help='keyword arguments of forward() as a JSON object, e.g. '
                             '\'{"use_cache": false}\'')
    parser.add_argument("--device", choices=("meta", "cpu", "cuda"), default=None,
                        help="where the model and inputs are built (default meta: nothing is "
                             "allocated, the counts are the same)")
    parser.add_argument("--view", action="append", default=None, metavar="VIEW[,VIEW]",
                        help="summary, top, tree, operators, module_operators or all "
                             f"(default {','.join(DEFAULT_VIEWS)}); with --format csv: tree (one "
                             "row per module, the default) or operators (one row per op)")
    parser.add_argument("--depth", type=int, default=-1,
                        help="deepest module level shown in the tree and top views (-1: all)")
    parser.add_argument("--top", type=int, default=3,
                        help="module types per depth in the top view (-1: all; default 3)")
    parser.add_argument("--group-by", choices=("type", "path"), default="type",
                        help="the top view ranks module types (default) or module paths")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table (text), json (the whole report, reloadable with "
                             "Report.model_validate_json), csv or md (Markdown)")
    parser.add_argument("--output", metavar="FILE", default=None,
                        help="write there instead of stdout")
    parser.add_argument("--strict", action="store_true",
                        help="fail (exit 1) on an op with no formula instead of listing it")
    parser.add_argument("--debug", action="store_true", help="print tracebacks")
    parser.add_argument("--version", action="version", version=f"exportflops {__version__}")
    return parser


def _check(ns: argparse.Namespace) -> None:
    """Argument errors, found before the model is built."""
    from .render import VIEWS

    views = [v.strip().replace("-", "_") for arg in (ns.view or []) for v in arg.split(",")]
    if "all" in views:
        views = list(VIEWS)
    for view in views:
        if view not in VIEWS:
            raise UsageError(f"unknown view {view!r}; choose from {', '.join(VIEWS)} or all.")
    if ns.format == "json" and views:
        raise UsageError("--view does not apply to --format json: the JSON holds the whole "
                         "report; render it again from Report.model_validate_json.")
    if ns.format == "csv" and views not in ([], ["tree"], ["operators"]):
        raise UsageError("--format csv writes one table: --view tree (one row per module, the "
                         "default) or --view operators (one row per op).")
    ns.views = views or list(DEFAULT_VIEWS)
    if ns.depth < -1 or ns.top < -1:
        raise UsageError("--depth and --top take a count, or -1 for all.")
    ns.shapes = [_parse_input(text) for text in ns.input]
    if ns.kwargs is not None:
        try:
            ns.kwargs = json.loads(ns.kwargs)
        except json.JSONDecodeError as error:
            raise UsageError(f"--kwargs is not valid JSON ({error}): pass an object such as "
                             f"'{{\"use_cache\": false}}'.") from None
        if not isinstance(ns.kwargs, dict):
            raise UsageError(f"--kwargs must be a JSON object of keyword arguments, got "
                             f"{type(ns.kwargs).__name__}.")
    if ns.model.endswith(".pt2") and (ns.input or ns.kwargs is not None or ns.device):
        raise UsageError(f"{ns.model} is a saved program: it is analyzed with the example "
                         f"inputs it was saved with, so --input, --kwargs and --device do not "
                         f"apply.")


def _parse_input(text: str):
    """``1,3,224,224`` or ``1,1024:int64`` -> (sizes, torch dtype)."""
    import torch

    shape, _, dtype_name = text.partition(":")
    try:
        sizes = [int(s) for s in shape.split(",")]
    except ValueError:
        raise UsageError(f"--input {text!r}: sizes must be integers separated by commas, "
                         f"optionally followed by :dtype, e.g. 1,3,224,224 or 1,1024:int64."
                         ) from None
    if any(s < 0 for s in sizes):
        raise UsageError(f"--input {text!r}: sizes cannot be negative.")
    dtype = getattr(torch, dtype_name or "float32", None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"--input {text!r}: unknown dtype {dtype_name!r}; use a torch dtype "
                         f"name such as float32, bfloat16, float16 or int64.")
    return sizes, dtype


def _run(ns: argparse.Namespace) -> str:
    from .api import analyze

    if ns.model.endswith(".pt2"):
        if not os.path.isfile(ns.model):
            raise UsageError(f"no saved program at {ns.model!r}: pass the path of a file written "
                             f"by torch.export.save(program, path).")
        with _quiet_torch(ns.debug):
            report = analyze(ns.model, strict=ns.strict)
        return _render(ns, report, extra_reprs=None)
    model, args, kwargs = _build(ns, _device(ns.device or "meta"))
    with _quiet_torch(ns.debug):
        report = analyze(model, args, kwargs, strict=ns.strict)
    extra_reprs = {path: module.extra_repr()
                   for path, module in model.named_modules(remove_duplicate=False)}
    return _render(ns, report, extra_reprs)


@contextlib.contextmanager
def _quiet_torch(debug: bool):
    """Without --debug, hide what torch writes to stderr while exporting: its logged warnings
    (guards, unbacked symbols) and the partial graph torch.export prints on a failure. The
    failure itself is reported once, as one paragraph, by _fail."""
    if debug:
        yield
        return
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        torch_logger.setLevel(level)


def _render(ns: argparse.Namespace, report, extra_reprs) -> str:
    from .render import flops_report, to_csv, to_markdown

    if ns.format == "json":
        return report.model_dump_json(indent=2) + "\n"
    if ns.format == "csv":
        return to_csv(report, rows="operators" if ns.views == ["operators"] else "modules")
    if ns.format == "md":
        return to_markdown(report, view=ns.views, depth=ns.depth, top=ns.top,
                           group_by=ns.group_by, extra_reprs=extra_reprs)
    return flops_report(report, view=ns.views, depth=ns.depth, top=ns.top, group_by=ns.group_by,
                        extra_reprs=extra_reprs)


def _device(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch.cuda.is_available() is False on this machine "
                         "(is this a CPU build of torch?); use --device meta, which counts the "
                         "same without allocating anything.")
    return torch.device(name)


def _build(ns: argparse.Namespace, device) -> tuple[Any, Any, dict | None]:
    """The model, its positional args and keyword args, on ``device``."""
    import torch

    from .examples import EXAMPLES

    kwargs = ns.kwargs
    if ns.model in EXAMPLES:
        model, args = EXAMPLES[ns.model](device=device)
    elif ns.model.startswith("hf:"):
        model, args, kwargs = _hf_model(ns.model.removeprefix("hf:"), device, ns.kwargs)
    elif ":" in ns.model:
        model, args = _call_factory(_resolve_factory(ns.model), device)
    else:
        raise UsageError(
            f"MODEL {ns.model!r} is not a built-in example ({', '.join(sorted(EXAMPLES))}), a "
            f"pkg.module:factory or path/file.py:factory, a saved .pt2 or hf:<model_type>. "
            f"See exportflops --help.")
    if ns.shapes:
        # Zeros: valid token ids and images alike; the counts depend on shapes only.
        args = tuple(torch.zeros(sizes, dtype=dtype, device=device) for sizes, dtype in ns.shapes)
    if args is None:
        raise UsageError(f"{ns.model} returned a model without inputs: give its inputs with "
                         f"--input SHAPE[:DTYPE], once per positional argument of forward().")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{ns.model} must return an nn.Module or (module, args), got "
                         f"{type(model).__name__}.")
    return model, args, kwargs


def _resolve_factory(spec: str):
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        module = _import_file(target)
    else:
        # As `python -m` does, so that `pkg.module` resolves from the current directory.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name and target.startswith(error.name):
                raise UsageError(f"cannot import {target!r} ({error}): MODEL "
                                 f"pkg.module:factory names an importable module; for a file "
                                 f"write path/to/file.py:factory.") from None
            raise BuildError(f"importing {target} failed: {error}") from error
        except Exception as error:
            raise BuildError(f"importing {target} failed: {type(error).__name__}: {error}") from error
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            public = sorted(n for n in vars(module) if callable(getattr(module, n))
                            and not n.startswith("_"))
            raise UsageError(f"{target} has no {attr!r}; callables there: "
                             f"{', '.join(public) or 'none'}.")
        factory = getattr(factory, part)
    if not callable(factory):
        raise UsageError(f"{spec} is a {type(factory).__name__}, not a callable that returns a "
                         f"model.")
    return factory


def _import_file(path: str):
    if not os.path.isfile(path):
        raise UsageError(f"no file {path!r}: MODEL path/to/file.py:factory names an existing "
                         f"Python file.")
    name = "_exportflops_model_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Like running the file as a script: its directory is on the path for its own imports.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise BuildError(f"running {path} failed: {type(error).__name__}: {error}") from error
    return module


def _call_factory(factory, device) -> tuple[Any, Any]:
    import torch
    import torch.utils._pytree as pytree

    takes_device = _accepts(factory, "device")
    try:
        result = factory(device=device) if takes_device else factory()
    except Exception as error:
        raise BuildError(f"the factory raised {type(error).__name__}: {error}") from error
    model, args = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    if not takes_device and isinstance(model, torch.nn.Module):
        model = model.to(device)
        args = pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, args)
    return model, args


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C extensions have no signature
        return False


def _hf_model(model_type: str, device, kwargs: dict | None):
    """A Hugging Face model of ``model_type`` from its default config (no download)."""
    try:
        import transformers
    except ImportError as error:
        raise UsageError(f"hf:{model_type} needs the transformers package, which is not "
                         f"installed ({error}); pip install transformers, or pass a "
                         f"pkg.module:factory that builds the model.") from None
    if model_type not in transformers.CONFIG_MAPPING:
        raise UsageError(f"hf:{model_type}: transformers {transformers.__version__} knows no "
                         f"model_type {model_type!r}; write a config's model_type, such as "
                         f"gpt2, llama, mistral or bert (transformers.CONFIG_MAPPING lists "
                         f"them all).")
    config = transformers.AutoConfig.for_model(model_type)
    try:
        with device:
            try:
                model = transformers.AutoModelForCausalLM.from_config(config)
            except ValueError:  # not a causal LM (an encoder): the base model
                model = transformers.AutoModel.from_config(config)
    except Exception as error:
        raise BuildError(f"transformers could not build {model_type} from its default config: "
                         f"{type(error).__name__}: {error}") from error
    import torch

    model.eval()
    parameters = inspect.signature(model.forward).parameters
    args = (_hf_input(next(iter(parameters)), config, device),)
    defaults = {}
    if "decoder_input_ids" in parameters:  # encoder-decoder: a decoder prompt as long
        defaults["decoder_input_ids"] = _hf_input("input_ids", config, device)
    if "use_cache" in parameters:
        # The KV-cache output does not export (shared/REFERENCES.md); a prefill needs none.
        defaults["use_cache"] = False
    return model, args, defaults | (kwargs or {})


def _hf_input(name: str, config, device):
    """A zero example for a Hugging Face model's first input, sized from its config: token ids
    (HF_DEFAULT_SEQ_LEN), an image, or a whisper-style log-mel spectrogram."""
    import torch

    if name == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        return torch.zeros((1, getattr(config, "num_channels", 3), size, size), device=device)
    if name == "input_features":
        frames = 2 * getattr(config, "max_source_positions", 1500)
        return torch.zeros((1, getattr(config, "num_mel_bins", 80), frames), device=device)
    return torch.zeros((1, HF_DEFAULT_SEQ_LEN), dtype=torch.long, device=device)


def _fail(ns: argparse.Namespace, message: str, code: int) -> int:
    """Print one paragraph on stderr: the message up to its first blank line (torch's errors run
    on for pages; the traceback, with the whole message, is --debug's)."""
    paragraph = " ".join(message.strip().split("\n\n")[0].split())
    if ns.debug:
        traceback.print_exc()
    elif code == 1:
        paragraph += " (--debug shows the traceback and the whole message)"
    print(paragraph, file=sys.stderr)
    return code
