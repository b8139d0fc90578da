"""The ``exportflops`` console script (and ``python -m exportflops``), run for real in a
subprocess: each MODEL form, each format, each error exit code with its message, and the README's
first command as written.

The subprocesses import this checkout's package (PYTHONPATH), whichever copy pip installed.

Hand counts of the factory models below:
  mlp / bare: Linear(4, 8), ReLU, Linear(8, 2) on (3, 4): 3*4*8 + 3*8*2 = 144 MACs;
      FLOPs 2*144 + biases 3*8 + 3*2 + ReLU 3*8 = 342; params 4*8 + 8 + 8*2 + 2 = 58.
  pair: x (3, 4) @ y (5, 4).T in float64: 3*5*4 = 60 MACs; reads (12 + 20) * 8 = 256 bytes.
  Repeat(times=t): t calls of Linear(4, 4) on (2, 4): 2*4*4 = 32 MACs each.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex

import pytest
import torch

from exportflops.cli import main
from tests.cli_support import ROOT, one_paragraph, report_of, run

README = ROOT / "README.md"
MLP_MACS, MLP_FLOPS, MLP_PARAMS = 144, 342, 58
# --- the README ------------------------------------------------------------------------------

def readme_main_command() -> list[str]:
    """The analysis part of the first command of the README's first bash block: what follows
    its ``pip install`` steps."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    line = next(line for line in block.splitlines() if line.strip() and not line.startswith("#"))
    steps = [step.strip() for step in line.split("&&")]
    [analysis] = [step for step in steps if not step.startswith("pip install")]
    return shlex.split(analysis)


def test_readme_main_command_runs_as_written_and_prints_the_report():
    command = readme_main_command()
    assert command == ["exportflops", "gpt2"]
    result = run(*command[1:])
    assert result.returncode == 0, result.stderr
    # nanoGPT's GPT-2 124M at 1024 tokens: 212,678,148,096 matmul FLOPs (shared/REFERENCES.md:
    # Karpathy's table with the model file's vocab 50304 and the head on the last position).
    assert re.search(r"matmul FLOPs\s+212\.68 G", result.stdout)
    assert "Module tree" in result.stdout and "(0)..(11): Block x 12" in result.stdout


# --- each MODEL form -------------------------------------------------------------------------

def test_built_in_gpt2_as_json_holds_karpathys_matmul_total():
    report = report_of(run("gpt2", "--format", "json"))
    assert report.total.matmul_flops == 212_678_148_096


def test_built_in_resnet50_through_python_dash_m():
    report = report_of(run("resnet50", "--format", "json", module=True))
    # torchvision's published ResNet-50: 25,557,032 params, 4.089 G conv + linear MACs
    # (derived per stage in tests/examples/test_resnet.py).
    assert (report.params, report.total.macs) == (25_557_032, 4_089_184_256)


def test_built_in_llama_is_llama_3_8b():
    """Llama 3 8B's parameters by hand: embedding and output 128,256*4,096 each; a layer has
    wq, wo 4,096^2, wk, wv 4,096*1,024, w1..w3 3*4,096*14,336 and two norms of 4,096:
    218,112,000; 32 layers + 2*525,336,576 + final norm 4,096 = 8,030,261,248."""
    result = run("llama", "--format", "csv")
    assert result.returncode == 0, result.stderr
    root = next(csv.DictReader(io.StringIO(result.stdout)))
    assert int(root["params"]) == 32 * 218_112_000 + 2 * 128_256 * 4_096 + 4_096 == 8_030_261_248


def test_file_factory_returning_model_and_inputs(models):
    report = report_of(run(f"{models / 'cli_models.py'}:mlp", "--format", "json"))
    assert (report.total.macs, report.total.flops, report.params) == (
        MLP_MACS, MLP_FLOPS, MLP_PARAMS)


def test_module_factory_with_inputs_from_the_command_line(models):
    report = report_of(run("cli_models:bare", "--input", "3,4", "--format", "json", cwd=models))
    assert report.total.macs == MLP_MACS
    assert [(s.shape, s.dtype) for s in report.inputs] == [([3, 4], "float32")]


def test_a_class_as_factory_with_repeated_typed_inputs(models):
    report = report_of(run(f"{models / 'cli_models.py'}:Pair", "--input", "3,4:float64",
                           "--input", "5,4:float64", "--format", "json"))
    assert (report.total.macs, report.total.bytes_read) == (60, 256)
    assert [s.dtype for s in report.inputs] == ["float64", "float64"]


def test_kwargs_reach_forward_and_device_reaches_the_factory(models):
    target = f"{models / 'cli_models.py'}:repeat"
    once = report_of(run(target, "--format", "json", "--device", "cpu"))
    thrice = report_of(run(target, "--kwargs", '{"times": 3}', "--format", "json"))
    assert (once.total.macs, thrice.total.macs) == (32, 3 * 32)


def test_saved_program(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(3, 4),)), path)
    assert report_of(run(str(path), "--format", "json")).total.macs == MLP_MACS


def test_a_sweep_of_a_size_a_saved_program_has_not_exits_2_naming_its_sizes(tmp_path, capsys):
    # Exported with static shapes: the program has no dynamic size to evaluate at 2 and 4.
    path = tmp_path / "linear.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), path)
    assert main([str(path), "--sweep", "batch=2,4"]) == 2
    err = capsys.readouterr().err
    assert f"--sweep: {path} has no dynamic size batch; its dynamic sizes are: none" in err
    assert one_paragraph(err)


def test_hugging_face_gpt2_from_its_default_config():
    """transformers' GPT-2 default config (12 layers, width 768, vocab 50,257) at 16 tokens:
    per layer qkv 16*768*2,304 + scores and values 2*12*16*16*64 + proj 16*768^2
    + MLP 2*16*768*3,072 = 113,639,424 MACs; 12 layers + LM head on all 16 positions
    16*768*50,257 = 1,981,231,104."""
    pytest.importorskip("transformers")
    report = report_of(run("hf:gpt2", "--input", "1,16:int64", "--format", "json"))
    assert report.model == "GPT2LMHeadModel"
    assert report.total.macs == 12 * 113_639_424 + 16 * 768 * 50_257 == 1_981_231_104


def test_hugging_face_vision_model_gets_an_image_input():
    """ViTConfig's defaults are ViT-B/16 at 224x224: torchvision publishes vit_b_16 at
    17.56 GFLOPS (its `_ops`, MACs; ViT_B_16_Weights.IMAGENET1K_V1)."""
    pytest.importorskip("transformers")
    report = report_of(run("hf:vit", "--format", "json"))
    assert report.model == "ViTModel" and round(report.total.macs / 1e9, 2) == 17.56


# --- each format and view option -------------------------------------------------------------

def test_table_views_depth_top_and_grouping(models):
    target = f"{models / 'cli_models.py'}:mlp"
    result = run(target, "--view", "top,operators", "--top", "-1", "--group-by", "path",
                 "--depth", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("All modules at each depth") and "Operators: cost per op" in out
    assert "Summary" not in out and "Module tree" not in out
    # Sequential's children are named 0, 1, 2: Linear(4, 8) has 4*8 + 8 = 40 params.
    assert "0: 40" in out and "2: 18" in out
    everything = run(target, "--view", "all").stdout
    assert all(title in everything for title in
               ("Summary of Sequential", "The top 3 module types", "Module tree",
                "Operators: cost", "Operators per module"))


def test_csv_rows_sum_to_the_totals(models):
    target = f"{models / 'cli_models.py'}:mlp"
    by_op = list(csv.DictReader(io.StringIO(
        run(target, "--format", "csv", "--view", "operators").stdout)))
    assert sum(int(row["flops"]) for row in by_op) == MLP_FLOPS
    by_module = list(csv.DictReader(io.StringIO(run(target, "--format", "csv").stdout)))
    assert sum(int(row["exclusive_flops"]) for row in by_module) == MLP_FLOPS
    assert int(by_module[0]["inclusive_macs"]) == MLP_MACS  # the root row


def test_markdown_to_an_output_file(models, tmp_path):
    out = tmp_path / "report.md"
    result = run(f"{models / 'cli_models.py'}:mlp", "--format", "md", "--output", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert f"wrote {out}" in result.stderr
    text = out.read_text()
    assert text.startswith("# exportflops report: Sequential")
    assert re.search(rf"\| params +\| +{MLP_PARAMS} \|", text)
    assert "&nbsp;&nbsp;(0): Linear" in text  # the tree keeps its indentation in Markdown


def test_help_shows_the_examples_and_exit_codes():
    result = run("--help")
    assert result.returncode == 0
    assert "examples:" in result.stdout and "exportflops gpt2" in result.stdout
    assert "exit status: 0 success; 2" in result.stdout


# --- errors: exit 2 (cannot run as written), exit 1 (building or analysis failed) ------------

@pytest.mark.parametrize(("args", "message"), [
    (["no_such_model"], "'no_such_model' is not a built-in example"),
    (["missing/file.py:build"], "no file 'missing/file.py'"),
    (["no_such_pkg.models:build"], "cannot import 'no_such_pkg.models'"),
    (["{models}/cli_models.py:nope"], "has no 'nope'; callables there:"),
    (["{models}/cli_models.py:not_a_model"], "must return an nn.Module or (module, args)"),
    (["{models}/cli_models.py:bare"], "give its inputs with --input SHAPE[:DTYPE]"),
    (["missing.pt2"], "no saved program at 'missing.pt2'"),
    (["gpt2", "--input", "1,8:floaty"], "unknown dtype 'floaty'"),
    (["gpt2", "--input", "1,x"], "sizes must be integers separated by commas"),
    (["gpt2", "--kwargs", "{use_cache: false}"], "--kwargs is not valid JSON"),
    (["gpt2", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
    (["gpt2", "--view", "graph"], "unknown view 'graph'"),
    (["gpt2", "--format", "xml"], "invalid choice: 'xml'"),
    (["gpt2", "--format", "json", "--view", "tree"], "--view does not apply to --format json"),
    # RenderOptions' own bounds, written with the flag and what it sets.
    (["gpt2", "--depth", "-2"], "--depth -2: input should be greater than or equal to -1: "
                                "--depth is the deepest module level shown"),
    (["gpt2", "--top", "-5"], "--top -5: input should be greater than or equal to -1"),
    (["gpt2", "--view", "summary", "--output", "no/such/dir/x.txt"], "cannot write --output"),
    (["hf:no_such_type"], "knows no model_type 'no_such_type'"),
    # hf.build's own checks of its counts, its arguments written as the flags.
    (["hf:llama", "--batch", "0"], "--batch 0: give a count of at least 1."),
    (["hf:llama", "--layers", "-1"], "--layers -1: give a count of at least 1."),
    # device_table.device_row's own refusal, naming the table's keys.
    (["gpt2", "--device-model", "h200x"], "--device-model: No device 'h200x' in the table; "
                                          "its keys are a100-sxm-40gb,"),
], ids=["unknown-name", "missing-file", "missing-module", "missing-factory", "not-a-module",
        "no-inputs", "missing-pt2", "bad-dtype", "bad-shape", "bad-kwargs-json",
        "kwargs-not-object", "unknown-view", "unknown-format", "view-with-json", "bad-depth",
        "bad-top",
        "unwritable-output", "unknown-hf-type", "zero-batch", "negative-layers",
        "unknown-device-model"])
def test_usage_errors_exit_2_with_one_paragraph(models, capsys, args, message):
    """In this process, through the command's ``main`` (the subprocess tests above and below
    show the console script exits with what ``main`` returns)."""
    if args[0].startswith("hf:"):
        pytest.importorskip("transformers")
    try:
        code = main([arg.replace("{models}", str(models)) for arg in args])
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert message in stderr and one_paragraph(stderr)


def test_a_usage_error_exits_2_from_the_console_script():
    result = run("no_such_model")
    assert result.returncode == 2, result.stderr
    assert "'no_such_model' is not a built-in example" in result.stderr
    assert one_paragraph(result.stderr)


def test_cuda_on_a_machine_without_it_exits_2():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run("gpt2", "--device", "cuda")
    assert result.returncode == 2 and "torch.cuda.is_available() is False" in result.stderr
    assert one_paragraph(result.stderr)


def test_a_failing_factory_exits_1_and_names_the_error(models):
    result = run(f"{models / 'cli_models.py'}:broken")
    assert result.returncode == 1
    assert "the factory raised RuntimeError: checkpoint shards missing" in result.stderr
    assert one_paragraph(result.stderr) and "--debug shows the traceback" in result.stderr
    debug = run(f"{models / 'cli_models.py'}:broken", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_a_model_that_does_not_export_exits_1(models):
    result = run(f"{models / 'cli_models.py'}:data_dependent")
    assert result.returncode == 1, result.stderr
    assert "analysis of" in result.stderr and one_paragraph(result.stderr)


def test_strict_exits_1_on_an_uncounted_op(models):
    target = f"{models / 'cli_models.py'}:custom"
    listed = run(target, "--view", "summary")
    assert listed.returncode == 0 and "exportflops_cli.scale" in listed.stdout
    result = run(target, "--strict")
    assert result.returncode == 1
    assert "exportflops_cli.scale" in result.stderr and one_paragraph(result.stderr)


# --- no noise --------------------------------------------------------------------------------

@pytest.mark.parametrize("example", ["gpt2", "llama", "resnet50"])
def test_a_built_in_example_prints_nothing_on_stderr(example):
    result = run(example, "--format", "json")
    assert result.returncode == 0 and result.stderr == ""


def test_warnings_and_torch_log_lines_during_the_analysis_stay_hidden_without_debug(models):
    quiet = run("cli_models:noisy", cwd=models)
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = run("cli_models:noisy", "--debug", cwd=models)
    assert "a warning raised while exporting" in loud.stderr
    assert "E an error line a torch logger wrote" in loud.stderr


def test_an_input_too_large_to_allocate_exits_2_with_a_sentence(models):
    """10^6 x 10^6 float32 zeros are 4 * 10^12 bytes: no CPU here has them."""
    result = run("cli_models:mlp", "--device", "cpu", "--input", "1000000,1000000", cwd=models)
    assert result.returncode == 2, result.stderr
    assert "4,000,000,000,000 bytes cannot be allocated on cpu" in result.stderr
    assert "--device meta" in result.stderr and one_paragraph(result.stderr)


def test_a_factory_returning_a_tuple_of_three_says_what_shapes_are_accepted(models):
    result = run("cli_models:three", cwd=models)
    assert result.returncode == 2
    assert "returned a tuple of 3 items (Sequential, tuple, dict)" in result.stderr
    assert "(model, args)" in result.stderr and one_paragraph(result.stderr)


BIG = '''import torch


def big(device=None):
    """Linear(2**14, 2**14): 2**28 float32 weights, 1 GiB."""
    return torch.nn.Linear(2**14, 2**14, device=device), torch.zeros(1, 2**14, device=device)
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the cap reads the process's data from Linux's /proc")
@pytest.mark.parametrize("factory", ["big", "cli_models:mlp"])
def test_a_model_past_the_memory_the_machine_has_free_exits_2_not_killed(
        models, tmp_path, monkeypatch, capsys, factory):
    """In process, with the machine's free memory read as 256 MiB: the 1 GiB model is refused
    with a sentence; the 58-parameter one is analyzed under the same cap."""
    import resource

    import exportflops.cli as cli
    import exportflops.hf.memory

    (tmp_path / "big.py").write_text(BIG)
    monkeypatch.setattr(exportflops.hf.memory, "free_bytes", lambda: 2**28)
    monkeypatch.chdir(models)
    spec = f"{tmp_path / 'big.py'}:big" if factory == "big" else factory
    limits = resource.getrlimit(resource.RLIMIT_DATA)
    code = cli.main([spec, "--device", "cpu", "--format", "json"])
    err = capsys.readouterr().err
    if factory == "big":
        assert code == 2, err
        # The allocation torch refused, not the BuildError that wraps it.
        assert "needs more memory than this machine has free (0.2 GiB; RuntimeError: " in err
        assert "--device meta" in err and one_paragraph(err)
    else:
        assert code == 0 and err == ""
    assert resource.getrlimit(resource.RLIMIT_DATA) == limits  # the cap ends with the run


@pytest.mark.parametrize(("cgroup", "files", "free"), [
    # No cgroup limit: 20 GiB available and 1 GiB of swap free.
    ("0::/job", {"sys/fs/cgroup/job/memory.max": "max",
                 "sys/fs/cgroup/job/memory.current": str(2**30)}, 21 * 2**30),
    # A container's cgroup v2 limit of 4 GiB, 1 GiB used: 3 GiB.
    ("0::/job", {"sys/fs/cgroup/job/memory.max": str(4 * 2**30),
                 "sys/fs/cgroup/job/memory.current": str(2**30)}, 3 * 2**30),
    # cgroup v1's: 6 GiB, 2 GiB used.
    ("4:cpu,memory:/job", {"sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(6 * 2**30),
                           "sys/fs/cgroup/memory/job/memory.usage_in_bytes": str(2 * 2**30)},
     4 * 2**30),
])
def test_the_free_memory_is_the_least_the_machine_and_its_cgroups_leave(tmp_path, cgroup,
                                                                         files, free):
    from exportflops.hf.memory import HEADROOM, free_bytes

    written = {"proc/meminfo": f"MemTotal: {32 * 2**20} kB\nMemAvailable: {20 * 2**20} kB\n"
                               f"SwapFree: {2**20} kB\n",
               "proc/self/cgroup": cgroup + "\n", **files}
    for path, text in written.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert free_bytes(f"{tmp_path}/") == int(free * (1 - HEADROOM))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="the cap reads the process's data from Linux's /proc")
def test_a_lower_limit_the_user_set_is_kept_and_not_called_the_machines():
    import resource

    from exportflops.hf.memory import memory_capped

    limits = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (2**45, limits[1]))  # ulimit -d: 32 TiB
    try:
        with memory_capped(2**46) as capped:  # more than the user's limit: theirs binds
            assert not capped and resource.getrlimit(resource.RLIMIT_DATA)[0] == 2**45
        with memory_capped(2**30) as capped:  # 1 GiB more than the process holds: ours
            assert capped and resource.getrlimit(resource.RLIMIT_DATA)[0] < 2**45
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] == 2**45
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, limits)
