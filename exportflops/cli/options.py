"""The command's options: the parser, its help, and the checks that run before a model is built."""

from __future__ import annotations

import argparse
from functools import partial

from ..errors import UsageError
from ..outputs import FORMATS
from .footprint import check_memory
from .splits import check_splits, refuse
from .targets import flagged
from .values import counts, dynamic_dim, input_shape, keyword_inputs, sweep_points
from ..version import versions_text

# The command prints less than flops_report's DEFAULT_VIEWS (which add top): its --help and
# examples promise "summary and module tree", and on a terminal the top view repeats the
# tree's largest rows; --view top (or all) adds it.
CLI_DEFAULT_VIEWS = ("summary", "tree")

EXAMPLES_HELP = """\
MODEL is one of (docs/command.md):
  gpt2, llama, resnet50       a built-in example (GPT-2 124M, Llama 3 8B, ResNet-50)
  pkg.module:factory          a callable in an importable module (or the current directory)
  path/to/file.py:factory     a callable defined in a Python file
  path/to/program.pt2         a program saved with torch.export.save, with its example inputs
  hf:<model_type>             a Hugging Face model from its default config, offline (docs/hf.md)
  hf:path/config.json, hf:org/name   ... from a config file, folder or the local cache
A factory returns a model (--input gives its inputs) or (model, args); one taking `device` is
called with --device, otherwise the model is moved there.

examples:
  exportflops gpt2                                   summary and module tree of GPT-2 124M
  exportflops resnet50 --view top,tree --depth 2     top module types and the tree to depth 2
  exportflops mypkg.models:build --input 1,3,224,224 --format csv --output resnet.csv
  exportflops ./net.py:Net --input 8,32 --input 8,32:float16 --kwargs '{"scale": 0.5}'
  exportflops gpt2 --device cpu --profile --trace gpt2.trace.json --format html --output gpt2.html
  exportflops gpt2 --input 1,1:int64 --device-model h100-sxm   decode step: memory-bound
  exportflops hf:llama --input 1,512:int64 --generate 128   prefill, per-token decode, request
  exportflops llama --fsdp 8 --mode train --rank 3   rank 3 of FSDP2 over 8 ranks, per block
  exportflops hf:whisper --layers 2                  whisper's 80 x 3000 features + decoder ids

exit status: 0 success; 2 the command cannot run as written (arguments, MODEL, missing file or
package); 1 building or analyzing the model failed. --debug adds the traceback.
"""


#: Every option but MODEL: (flags, `add_argument`'s keywords) under the help's group of what it
#: does, the groups in the order a run goes (what is built, what is counted, the analyses beside
#: the counts, what is printed). A new option joins the group of its topic;
#: tests/cli/test_cli_options.py checks that none is left in argparse's ungrouped "options".
#: Each help is one or two lines; docs/command.md and the page it links say the rest.
OPTIONS = {
    "model and inputs": {
        "--input": dict(action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="a positional input of forward(), e.g. 1,3,224,224 or 1,1024:int64 "
                             "(default float32); repeat for each"),
        "--kwargs": dict(metavar="JSON", default=None,
                         help="forward()'s keyword arguments, e.g. '{\"use_cache\": false}'"),
        "--layers": dict(type=int, default=None, metavar="N",
                         help="hf: at most N layers in each stack"),
        "--batch": dict(type=int, default=None, metavar="N",
                        help="hf: the example inputs' batch (default 1)"),
        "--seq": dict(type=int, default=None, metavar="N",
                      help="hf: the example inputs' tokens, frames or samples (default 128)"),
        "--device": dict(choices=("meta", "cpu", "cuda"), default=None,
                         help="where the model is built (default meta: nothing allocated, the "
                              "same counts; cpu: capped at the free memory)"),
    },
    "analysis": {
        "--mode": dict(choices=("forward", "train"), default="forward",
                       help="train also counts the backward (default forward)"),
        "--split-backward": dict(action="store_true",
                                 help="--mode train: the backward as its input and weight "
                                      "gradient passes (docs/training.md)"),
        "--strict": dict(action="store_true",
                         help="fail (exit 1) on an op with no formula instead of listing it"),
        "--full-export": dict(action="store_true",
                              help="trace every block, not each repeated block once; the same "
                                   "report"),
        "--dynamic": dict(action="append", default=[], metavar="NAME[=ARG:DIM]",
                          help="export with a dynamic size: batch, seq, or dim DIM of positional "
                               "input ARG (docs/dynamic-sizes.md)"),
        "--sweep": dict(action="append", default=[], metavar="NAME=V[,V...]",
                        help="evaluate dynamic size NAME at each value, e.g. seq=512,1024"),
        "--memory": dict(action="store_true",
                         help="one step's memory instead of its counts (docs/memory.md)"),
        "--fit": dict(metavar="BUDGET", default=None,
                      help="the blocks to checkpoint so a training step fits BUDGET: bytes, "
                           "80GiB, 40GB or a device key (docs/fit.md)"),
        "--optimizer": dict(choices=("adamw", "adam", "sgd", "adagrad", "rmsprop"), default=None,
                            help="--memory --mode train, --fit: the optimizer (default adamw)"),
        "--precision": dict(choices=("32-true", "bf16-mixed", "bf16-true", "bf16-master"),
                            default=None,
                            help="--memory --mode train: the step's dtypes (default 32-true)"),
        "--budget": dict(choices=("karpathy", "kaplan", "chinchilla", "palm"), default=None,
                         help="a published transformer budget beside the graph (docs/budgets.md)"),
    },
    "runtime and roofline": {
        "--profile": dict(action="store_true",
                          help="time the graph node by node on --device cpu or cuda: latency, "
                               "FLOP/s, MFU"),
        "--warmup": dict(type=int, default=10, help="--profile: untimed iterations"),
        "--repeat": dict(type=int, default=50, help="--profile: timed iterations"),
        "--trace": dict(metavar="FILE", default=None,
                        help="--profile: write the timeline as a Chrome/Perfetto trace"),
        "--device-model": dict(metavar="NAME", default=None,
                               help="the roofline on this device (a table key such as h100-sxm, "
                                    "or cpu) (docs/roofline.md)"),
    },
    "generation": {
        "--generate": dict(type=int, default=None, metavar="N",
                           help="generating N tokens after the prompt (--input's token ids) "
                                "with a KV cache (docs/generation.md)"),
        "--cache": dict(choices=("dynamic", "static"), default="dynamic",
                        help="--generate: a growing cache or a static one"),
        "--max-cache-len": dict(type=int, default=None, metavar="N",
                                help="--cache static: its entries (default prompt + N)"),
        "--full-logits": dict(action="store_true",
                              help="--generate: the prefill's LM head on every prompt position"),
    },
    "training steps": {
        "--seqlens": dict(type=partial(counts, least=1, example="100,250,40"), default=None,
                          metavar="L1,L2,...",
                          help="a step on one row packing documents of these lengths "
                               "(docs/flops-per-batch.md)"),
        "--conventions": dict(action="store_true",
                              help="--mode train, hf: models: the step's FLOPs by each stack's "
                                   "convention (docs/stacks.md)"),
    },
    "parallelism": {
        "--tp": dict(type=int, default=None, metavar="N",
                     help="one rank of the model split N ways by its tensor-parallel plan "
                          "(docs/parallel.md)"),
        "--fsdp": dict(type=int, default=None, metavar="N",
                       help="one rank of FSDP2 over N ranks; with --tp M, a 2-D mesh (N, M)"),
        "--pp": dict(type=int, default=None, metavar="N",
                     help="pipeline parallelism over N stages (docs/pipeline.md)"),
        "--schedule": dict(default=None, metavar="NAME", help="--pp: the pipeline schedule"),
        "--microbatches": dict(type=int, default=None, metavar="M",
                               help="--pp: microbatches per step"),
        "--ep": dict(type=int, default=None, metavar="N",
                     help="expert parallelism over N ranks (docs/expert-parallel.md)"),
        "--routing": dict(default=None, metavar="N1,N2,...",
                          help="--ep: token copies per expert (default: balanced)"),
        "--cp": dict(type=int, default=None, metavar="N",
                     help="context parallelism over N ranks (docs/context-parallel.md)"),
        "--no-load-balance": dict(action="store_true",
                                  help="--cp: contiguous blocks, not torch's round-robin"),
        "--rank": dict(type=int, default=0,
                       help="the rank analyzed (default 0); with --fsdp N --tp M, rank r is "
                            "FSDP index r // M, tensor-parallel index r %% M"),
        "--link-gbps": dict(type=float, default=None, metavar="GB/S",
                            help="time each collective at this bus bandwidth between ranks"),
    },
    "output": {
        "--view": dict(action="append", default=None, metavar="VIEW[,VIEW]",
                       help="summary, top, tree, operators, module_operators, collectives or "
                            f"all (default {','.join(CLI_DEFAULT_VIEWS)}, and collectives "
                            f"with --tp/--fsdp; csv: tree or operators)"),
        "--depth": dict(type=int, default=-1,
                        help="deepest module level in the tree and top views (-1: all)"),
        "--top": dict(type=int, default=3,
                      help="module types per depth in the top view (-1: all; default 3)"),
        "--group-by": dict(choices=("type", "path"), default="type",
                           help="the top view ranks module types (default) or paths"),
        "--format": dict(choices=FORMATS, default="table",
                         help="table, json (the whole report), csv, md, or html (a page, with "
                              "--output)"),
        "--output": dict(metavar="FILE", default=None, help="write there instead of stdout"),
    },
    "general": {
        "-h --help": dict(action="help", help="show this help message and exit"),
        "--debug": dict(action="store_true", help="print tracebacks"),
        "--progress": dict(action="store_true",
                           help="each stage and its seconds on stderr, also in a pipe or CI"),
        "--version": dict(action="version", version=versions_text(),
                          help="the versions of exportflops, torch and transformers"),
    },
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """argparse's own errors (a bad option or value), as one paragraph like the others."""
        self.exit(2, f"exportflops: error: {message}; see exportflops --help.\n")


def parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="exportflops",
        description="FLOPs, MACs and bytes per module and per operator of a PyTorch model, "
                    "counted from its torch.export graph.",
        epilog=EXAMPLES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False)  # -h/--help is added under "general", with --debug and --version
    parser.add_argument("model", metavar="MODEL", help="what to analyze (see below)")
    for title, options in OPTIONS.items():
        group = parser.add_argument_group(title)
        for flags, keywords in options.items():
            group.add_argument(*flags.split(), **keywords)
    return parser


def check(ns: argparse.Namespace) -> None:
    """Argument errors, found before the model is built."""
    from ..render import VIEWS

    views = [v.strip().replace("-", "_") for arg in (ns.view or []) for v in arg.split(",")]
    if "all" in views:
        views = list(VIEWS)
    ns.views = views or [*CLI_DEFAULT_VIEWS, *(["collectives"] if ns.tp or ns.fsdp else [])]
    ns.render_options = _render_options(ns)
    if ns.format == "json" and views:
        raise UsageError("--view does not apply to --format json: the JSON holds the whole "
                         "report; render it again from Report.model_validate_json.")
    if ns.format == "csv" and views not in ([], ["tree"], ["operators"]):
        raise UsageError("--format csv writes one table: --view tree (one row per module, the "
                         "default) or --view operators (one row per op).")
    if ns.format == "html" and (views or not ns.output):
        raise UsageError("--format html writes one page with every picture and table to a "
                         "file: pass --output report.html, and no --view.")
    ns.shapes = [input_shape(text) for text in ns.input]
    if ns.kwargs is not None:
        ns.kwargs = keyword_inputs(ns.kwargs)
    _check_analyses(ns)
    _check_hf(ns)
    if ns.model.endswith(".pt2") and (ns.input or ns.kwargs is not None or ns.device
                                      or ns.dynamic):
        raise UsageError(f"{ns.model} is a saved program: it is analyzed with the example "
                         f"inputs it was saved with, so --input, --kwargs, --device and --dynamic "
                         f"do not apply.")


#: The flag that sets each field of `RenderOptions` the command gives, and its dest.
_RENDER_FLAGS = {"view": ("--view", "views"), "depth": ("--depth", "depth"),
                 "top": ("--top", "top"), "link_bytes_per_s": ("--link-gbps", "link_gbps")}


def _render_options(ns: argparse.Namespace):
    """The FLOPs views' `RenderOptions`, checked by it (the bandwidth by
    `records.collectives.check_link`), its refusal naming the flag and the value given."""
    from pydantic import ValidationError

    from ..render import RenderOptions

    link = None if ns.link_gbps is None else ns.link_gbps * 1e9
    try:
        return RenderOptions(view=ns.views, depth=ns.depth, top=ns.top, group_by=ns.group_by,
                             link_bytes_per_s=link)
    except ValidationError as error:
        first = error.errors()[0]
        (flag, dest), field = _RENDER_FLAGS[first["loc"][0]], first["loc"][0]
        given = getattr(ns, dest)
        why = first.get("ctx", {}).get("error") or (
            f"{first['msg'].lower()}: {flag} is the "
            f"{RenderOptions.model_fields[field].description.lower()}")
        raise UsageError(f"{flag} {','.join(given) if field == 'view' else given}: {why}"
                         ) from None


def _check_hf(ns: argparse.Namespace) -> None:
    """--layers, --batch and --seq size the model and inputs hf: builds (`hf.build` checks
    their counts)."""
    given = [f"--{name}" for name in ("layers", "batch", "seq") if getattr(ns, name) is not None]
    if given and not ns.model.startswith("hf:"):
        raise UsageError(f"{given[0]} sizes a model built by hf:; for {ns.model} give the "
                         f"inputs' shapes with --input SHAPE[:DTYPE].")
    if given and ns.input and given != ["--layers"]:
        raise UsageError("--batch and --seq size the example inputs hf: makes; --input "
                         "replaces them: give one or the other.")


#: Each analysis: whether the flags ask for it, what it does, what it does not combine with
#: (`splits.GIVEN` says whether each is given).
_ANALYSES = (
    (lambda ns: ns.profile,
     "--profile times one forward at fixed sizes (with --pp, each stage's forward and "
     "backward)", ("--mode train without --pp", "--dynamic", "--sweep", "--budget")),
    (lambda ns: ns.device_model is not None,
     "--device-model draws one roofline at fixed sizes, as a table, Markdown or JSON",
     ("--sweep", "--format csv")),
    (lambda ns: ns.format == "html", "--format html draws one report", ("--sweep", "--budget")),
    (lambda ns: ns.generate is not None,
     "--generate N counts the tokens generated after the prompt (--input's token ids) of a "
     "model built here, as a table or --format json",
     ("a saved .pt2", "--dynamic", "--sweep", "--profile", "--budget", "--mode train",
      "--kwargs", "--format csv, md or html")),
    (lambda ns: ns.seqlens is not None,
     "--seqlens counts a step of a model built here on one packed row, as a table, Markdown "
     "or JSON", ("a saved .pt2", "--profile", "--dynamic", "--sweep", "--budget",
                 "--device-model", "--generate", "--tp", "--fsdp", "--format csv or html")),
    (lambda ns: ns.budget is not None,
     "--budget compares one forward at fixed sizes, as a table, Markdown or JSON",
     ("--sweep", "--mode train", "--format csv")),
    (lambda ns: ns.fit is not None,
     "--fit BUDGET plans a training step of a model built here, printed as a table or JSON",
     ("a saved .pt2", "--view", "--memory", "--profile", "--trace", "--dynamic", "--sweep",
      "--budget", "--generate", "--seqlens", "--split-backward", "--format csv, md or html")),
    (lambda ns: ns.split_backward,
     "--split-backward splits the backward of one model's training step (with --pp, a "
     "zero-bubble --schedule splits each stage's backward itself)",
     ("--pp", "--ep", "--cp", "--generate", "--seqlens", "--profile")),
)


def _check_analyses(ns: argparse.Namespace) -> None:
    """--dynamic, --sweep, --profile and --budget parsed; each analysis refused with what it
    does not combine with (`_ANALYSES`) or without what it needs."""
    ns.dims = dict(dynamic_dim(text) for arg in ns.dynamic for text in arg.split(","))
    ns.points = sweep_points(ns.sweep)
    unknown = sorted(set(ns.points) - set(ns.dims))
    if unknown and not ns.model.endswith(".pt2"):
        raise UsageError(f"--sweep {unknown[0]} needs --dynamic {unknown[0]}: the size must be "
                         f"dynamic when exported to be evaluated at other values.")
    if ns.profile and ns.device not in ("cpu", "cuda"):
        raise UsageError("--profile times real runs: pass --device cpu or --device cuda "
                         "(meta tensors hold no data to run).")
    for asked, what, refused in _ANALYSES:
        refuse(ns, asked, what, refused)
    if ns.profile:
        from ..runtime.measure import check_iterations
        with flagged():
            check_iterations(ns.warmup, ns.repeat, "--profile")
    if ns.device_model not in (None, "cpu"):
        from ..device_table import device_row

        with flagged("--device-model"):  # an unknown key: the error names the table's keys
            device_row(ns.device_model)
    if ns.trace and not ns.profile:
        raise UsageError("--trace writes the measured timeline: add --profile (and --device cpu "
                         "or cuda).")
    _check_cache(ns)
    if ns.full_logits and ns.generate is None:
        raise UsageError("--full-logits counts the prefill of a generation: it needs "
                         "--generate N.")
    if ns.generate is not None:
        from ..generation.limits import check_options
        with flagged():
            check_options(ns.generate, ns.cache, ns.max_cache_len)
    if ns.split_backward and ns.mode != "train":
        raise UsageError("--split-backward splits the backward of one model's training step: "
                         "it needs --mode train.")
    if ns.routing is not None:  # parsed here: argparse's own error would end the process
        try:
            ns.routing = counts(ns.routing, least=0, example="10,30,20,4")
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"--routing {error}.") from None
    check_splits(ns)
    check_memory(ns)


def _check_cache(ns: argparse.Namespace) -> None:
    """--cache and --max-cache-len need --generate N, each refusal naming the flags it needs;
    with it, what each needs of the other is `generation.limits.check_options`'."""
    if ns.generate is not None or (ns.cache == "dynamic" and ns.max_cache_len is None):
        return
    if ns.cache == "dynamic":
        raise UsageError(f"--max-cache-len sizes a static cache: it needs --cache static, and "
                         f"--cache needs --generate N; pass --generate N --cache static "
                         f"--max-cache-len {ns.max_cache_len}.")
    flags = "--cache and --max-cache-len need" if ns.max_cache_len is not None \
        else "--cache needs"
    raise UsageError(f"{flags} --generate N: the cache holds the keys and values of the "
                     f"tokens generated after the prompt.")
