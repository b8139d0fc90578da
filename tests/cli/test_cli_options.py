"""The command's options (``exportflops.cli.options``): every flag users call keeps its spelling,
dest, default and metavar; ``--help`` reads by topic; the usage errors found before a model is
built exit 2 with one line that names the flag.

The errors run through ``exportflops.cli.main`` in this process: ``check`` refuses them before
any model is built, so no subprocess is needed.
"""

from __future__ import annotations

import pytest
import torch

from exportflops.cli import main
from exportflops.cli.options import check, parser
from tests.cli_support import one_paragraph

INT64_MAX = 9223372036854775807  # 2**63 - 1: torch's sizes, element counts and bytes are int64

# The option strings of the parser before its options were grouped (commit 241ca90),
# sorted: the interface users and scripts call, so none may go.
OPTIONS_BEFORE_GROUPS = [
    "--batch", "--budget", "--cache", "--debug", "--depth", "--device", "--device-model",
    "--dynamic", "--format", "--fsdp", "--full-export", "--generate", "--group-by", "--help",
    "--input", "--kwargs", "--layers", "--link-gbps", "--max-cache-len", "--mode", "--output",
    "--profile", "--rank", "--repeat", "--seq", "--strict", "--sweep", "--top", "--tp",
    "--trace", "--version", "--view", "--warmup", "-h",
]

# Each option that takes part in a run, as of the same commit: (option, dest, default, metavar),
# then an example of what a user passes and the value it parses to.
OPTIONS = [
    ("--input", "input", [], "SHAPE[:DTYPE]", ["1,8:int64"], ["1,8:int64"]),
    ("--kwargs", "kwargs", None, "JSON", ['{"use_cache": false}'], '{"use_cache": false}'),
    ("--layers", "layers", None, "N", ["2"], 2),
    ("--batch", "batch", None, "N", ["4"], 4),
    ("--seq", "seq", None, "N", ["16"], 16),
    ("--device", "device", None, None, ["cpu"], "cpu"),
    ("--mode", "mode", "forward", None, ["train"], "train"),
    ("--strict", "strict", False, None, [], True),
    ("--full-export", "full_export", False, None, [], True),
    ("--dynamic", "dynamic", [], "NAME[=ARG:DIM]", ["seq"], ["seq"]),
    ("--sweep", "sweep", [], "NAME=V[,V...]", ["seq=8,16"], ["seq=8,16"]),
    ("--budget", "budget", None, None, ["chinchilla"], "chinchilla"),
    ("--profile", "profile", False, None, [], True),
    ("--warmup", "warmup", 10, None, ["3"], 3),
    ("--repeat", "repeat", 50, None, ["7"], 7),
    ("--trace", "trace", None, "FILE", ["run.trace.json"], "run.trace.json"),
    ("--device-model", "device_model", None, "NAME", ["h100-sxm"], "h100-sxm"),
    ("--generate", "generate", None, "N", ["8"], 8),
    ("--cache", "cache", "dynamic", None, ["static"], "static"),
    ("--max-cache-len", "max_cache_len", None, "N", ["64"], 64),
    ("--tp", "tp", None, "N", ["4"], 4),
    ("--fsdp", "fsdp", None, "N", ["8"], 8),
    ("--rank", "rank", 0, None, ["3"], 3),
    ("--link-gbps", "link_gbps", None, "GB/S", ["450"], 450.0),
    ("--view", "view", None, "VIEW[,VIEW]", ["top,tree"], ["top,tree"]),
    ("--depth", "depth", -1, None, ["2"], 2),
    ("--top", "top", 3, None, ["5"], 5),
    ("--group-by", "group_by", "type", None, ["path"], "path"),
    ("--format", "format", "table", None, ["csv"], "csv"),
    ("--output", "output", None, "FILE", ["report.txt"], "report.txt"),
    ("--debug", "debug", False, None, [], True),
]

# The help's headings, in the order it prints them, and the options each holds.
GROUPS = {
    "model and inputs": ["--input", "--kwargs", "--layers", "--batch", "--seq", "--device"],
    "analysis": ["--mode", "--split-backward", "--strict", "--full-export", "--dynamic",
                 "--sweep", "--budget"],
    "runtime and roofline": ["--profile", "--warmup", "--repeat", "--trace", "--device-model"],
    "generation": ["--generate", "--cache", "--max-cache-len", "--full-logits"],
    "training steps": ["--seqlens"],
    "parallelism": ["--tp", "--fsdp", "--pp", "--schedule", "--microbatches", "--ep", "--routing",
                    "--cp", "--no-load-balance", "--rank", "--link-gbps"],
    "output": ["--view", "--depth", "--top", "--group-by", "--format", "--output"],
    "general": ["-h", "--help", "--debug", "--progress", "--version"],
}


def refused(capsys, *args: str) -> str:
    """``exportflops ARGS`` exits 2 with one line on stderr, no traceback: that line."""
    assert main(list(args)) == 2
    stderr = capsys.readouterr().err
    assert one_paragraph(stderr) and "\n" not in stderr.strip(), stderr
    assert "C++" not in stderr and "frame #" not in stderr, stderr
    return stderr.strip()


# --- the options and their help ---------------------------------------------------------------

def test_every_option_string_the_command_had_is_still_there():
    assert set(OPTIONS_BEFORE_GROUPS) <= set(parser()._option_string_actions)
    # The table below covers all of them but the three that print and exit.
    listed = {option for option, *_ in OPTIONS}
    assert listed | {"-h", "--help", "--version"} == set(OPTIONS_BEFORE_GROUPS)


@pytest.mark.parametrize(("option", "dest", "default", "metavar", "given", "parsed"), OPTIONS,
                         ids=[option for option, *_ in OPTIONS])
def test_each_option_keeps_its_dest_default_and_metavar_and_parses(
        option, dest, default, metavar, given, parsed):
    action = parser()._option_string_actions[option]
    assert (action.dest, action.default, action.metavar) == (dest, default, metavar)
    assert getattr(parser().parse_args(["gpt2"]), dest) == default
    assert getattr(parser().parse_args(["gpt2", option, *given]), dest) == parsed


@pytest.mark.parametrize("option", ["-h", "--help"])
def test_help_prints_the_group_headings_in_order_and_exits_0(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([option])
    assert exit_.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    headings = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert [h for h in headings if h in GROUPS] == list(GROUPS)
    assert "examples:" in lines  # the epilog still follows the options


def test_version_prints_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert "exportflops" in capsys.readouterr().out


@pytest.mark.parametrize("title", list(GROUPS))
def test_each_group_holds_the_options_of_its_topic(title):
    groups = {group.title: {s for a in group._group_actions for s in a.option_strings}
              for group in parser()._action_groups}
    assert set(GROUPS[title]) <= groups[title]


def test_no_option_is_left_without_a_topic():
    """argparse puts an option added to the parser itself under "options": a new flag
    (--pp, --ep, --cp, --seqlens...) joins the group of what it does instead."""
    ungrouped = [action.option_strings for group in parser()._action_groups
                 if group.title not in GROUPS for action in group._group_actions
                 if action.option_strings]
    assert ungrouped == []


# --- --cache and --max-cache-len ---------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--max-cache-len", "64"],
     "--max-cache-len sizes a static cache: it needs --cache static, and --cache needs "
     "--generate N; pass --generate N --cache static --max-cache-len 64."),
    (["--input", "1,8:int64", "--generate", "4", "--max-cache-len", "16"],
     "--max-cache-len sizes a static cache: it needs --cache static; pass --generate 4 "
     "--cache static --max-cache-len 16."),
    (["--input", "1,8:int64", "--generate", "4", "--cache", "dynamic", "--max-cache-len", "16"],
     "it needs --cache static; pass --generate 4 --cache static"),
    (["--cache", "static"], "--cache needs --generate N: the cache holds"),
    (["--cache", "static", "--max-cache-len", "16"],
     "--cache and --max-cache-len need --generate N"),
    (["--input", "1,8:int64", "--generate", "4", "--cache", "static", "--max-cache-len", "0"],
     "--max-cache-len 0: a static cache holds a count of entries >= 1; pass --max-cache-len N "
     "with N >= 1"),
    # generation.limits.check_options' refusal, its arguments written as the flags.
    (["--input", "1,8:int64", "--generate", "0"],
     "--generate 0: a request generates a count of new tokens >= 1 after the prompt; pass "
     "--generate N with N >= 1."),
], ids=["max-cache-len-alone", "max-cache-len-without-static", "max-cache-len-with-dynamic",
        "cache-without-generate", "cache-and-max-cache-len-without-generate",
        "max-cache-len-zero", "no-new-tokens"])
def test_cache_options_say_which_flag_they_need(capsys, args, message):
    line = refused(capsys, "gpt2", *args)
    assert message in line
    assert "does not take" not in line  # not blamed on the model's prompt any more


def test_a_static_cache_with_its_length_passes_the_checks():
    ns = parser().parse_args(["hf:gpt2", "--input", "1,8:int64", "--generate", "4",
                              "--cache", "static", "--max-cache-len", "16"])
    check(ns)
    assert (ns.generate, ns.cache, ns.max_cache_len) == (4, "static", 16)


# --- --input sizes -----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "message"), [
    ("1,99999999999999999999",
     f"--input '1,99999999999999999999': size 99999999999999999999 is past {INT64_MAX} "
     f"(2**63 - 1)"),
    (f"{INT64_MAX + 1}:bool", f"size {INT64_MAX + 1} is past {INT64_MAX}"),
    # 2**62 x 4 elements of 8 bytes: 2**67 bytes, each size well inside int64.
    (f"{2**62},4:int64", f"--input '{2**62},4:int64': {2**62 * 4 * 8:,} bytes, past "
                         f"{INT64_MAX:,} (2**63 - 1)"),
    # 2**63 - 1 float32 elements: 4 bytes each, past the limit though the size is at it.
    (f"{INT64_MAX}", f"{INT64_MAX * 4:,} bytes, past {INT64_MAX:,}"),
    ("1,0", "--input '1,0': sizes must be at least 1, got 0."),
    ("1,-3", "--input '1,-3': sizes must be at least 1, got -3."),
], ids=["past-int64", "one-past-int64", "bytes-past-int64", "float32-bytes-past-int64", "zero",
        "negative"])
def test_an_input_size_out_of_range_is_a_usage_error_naming_flag_value_and_limit(
        capsys, value, message):
    assert message in refused(capsys, "gpt2", "--input", value)


def test_an_input_of_exactly_the_largest_byte_count_passes_the_checks():
    """2**63 - 1 one-byte elements are 2**63 - 1 bytes: the limit itself, allowed."""
    ns = parser().parse_args(["gpt2", "--input", f"{INT64_MAX}:bool", "--device", "meta"])
    check(ns)
    assert ns.shapes == [([INT64_MAX], torch.bool)]


# --- --warmup and --repeat ---------------------------------------------------------------------

@pytest.mark.parametrize(("args", "given"), [
    (["--warmup", "-1"], "--warmup -1, --repeat 50"),
    (["--repeat", "0"], "--warmup 10, --repeat 0"),
], ids=["negative-warmup", "no-timed-run"])
def test_profile_iterations_out_of_range_are_refused_by_the_profilers_check(capsys, args, given):
    """runtime.measure.check_iterations, the check profile() runs, before the model is built."""
    line = refused(capsys, "gpt2", "--device", "cpu", "--profile", *args)
    assert (f"--profile needs integers warmup >= 0 and repeat >= 1, got {given}: pass --warmup "
            f"the untimed iterations (0 or more) and --repeat the timed ones (1 or more).") in line
