"""The GPU suite's scripts, checked on CPU: every deliberate break applies to today's code exactly once,
names GPU tests that exist, leaves the broken file compilable, and the suite runner is valid bash."""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _breaks():
    spec = importlib.util.spec_from_file_location("gpu_breaks", ROOT / "benchmarks/gpu_host/breaks.py")
    mod = sys.modules.setdefault("gpu_breaks", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("name", [b.name for b in _breaks().BREAKS])
def test_break_applies_once_and_names_existing_tests(tmp_path, name):
    mod = _breaks()
    brk = mod.by_name([name])[0]
    target = tmp_path / brk.path
    target.parent.mkdir(parents=True)
    shutil.copy(ROOT / brk.path, target)
    mod.apply(tmp_path, brk)
    broken = target.read_text()
    assert broken != (ROOT / brk.path).read_text() and brk.new in broken
    compile(broken, str(target), "exec")
    for test in brk.tests:
        module, func = test.split("::")
        assert func in _test_names(ROOT / module), test
    if brk.old not in brk.new:  # a break that no longer matches the code says so
        with pytest.raises(ValueError, match="0 times"):
            mod.apply(tmp_path, brk)


def test_unknown_break_is_refused():
    with pytest.raises(SystemExit, match="unknown break"):
        _breaks().by_name(["no_such_break"])


def test_only_a_failed_check_counts_as_caught():
    """A fixture's ERROR (a hung or crashed server) is no check seeing the break."""
    outcome = _breaks().outcome
    errored = "ERROR tests/gpu/test_x.py::test_a - TimeoutError\n1 error in 480s"
    assert outcome(errored, 1) == {"caught": False, "failed_tests": [], "errored_tests": ["tests/gpu/test_x.py::test_a"],
                                   "returncode": 1}
    failed = "FAILED tests/gpu/test_x.py::test_b - AssertionError: differ\n" + errored
    assert outcome(failed, 1)["caught"] and outcome(failed, 1)["failed_tests"] == ["tests/gpu/test_x.py::test_b"]
    assert not outcome("1 passed", 0)["caught"]


def test_a_break_s_pytest_run_names_its_failed_and_errored_tests(tmp_path):
    """The breaks' own pytest arguments on a real pytest run: a fixture's error and a check's failure both reach
    ``outcome`` (with ``-rf`` alone the errored test went unrecorded)."""
    mod = _breaks()
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef server():\n    raise ConnectionError('server died')\n\n"
        "def test_a(server):\n    pass\n\ndef test_b():\n    assert 1 == 2\n")
    run = subprocess.run([sys.executable, "-m", "pytest", *mod.PYTEST_ARGS, "test_x.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    got = mod.outcome(run.stdout, run.returncode)
    assert got["failed_tests"] == ["test_x.py::test_b"] and got["errored_tests"] == ["test_x.py::test_a"], run.stdout


def test_suite_runner_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks/gpu_host/run_gpu_suite.sh")]).returncode == 0


@pytest.mark.parametrize("script", ["benchmarks/fleet_2gpu.py", "benchmarks/gpu_host/breaks.py",
                                    "benchmarks/gpu_host/cross_engine.py", "benchmarks/gpu_host/tiny_model_probe.py",
                                    "benchmarks/sparse_kernel_bench.py"])
def test_gpu_scripts_import_and_answer_help_on_cpu(script):
    """GPU-host scripts no CPU test runs: they import (product and benchmarks only, no test helper)
    and parse their command line."""
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def test_kernel_bench_names_the_sparse_decode_s_kv_split():
    """``sparse_kernel_bench.py --kernels``: each name is the FlashInfer plan the bench times (the product's
    ``DecodeSplit``: a CUDA graph's no-split plan, a fixed split in pages), and a name FlashInfer cannot plan is
    refused on the command line, naming it, before any GPU is touched."""
    from sparrow_server.sglang_plugin.scheduler.determinism import FLASHINFER_CHOICE, DecodeSplit

    spec = importlib.util.spec_from_file_location("kernel_bench", ROOT / "benchmarks/sparse_kernel_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.kernel_split("cuda-cores") == FLASHINFER_CHOICE
    assert bench.kernel_split("tensor-cores") == DecodeSplit(True, None, False)
    assert bench.kernel_split("tensor-cores:nosplit") == DecodeSplit(True, None, True)
    assert bench.kernel_split("tensor-cores:split=64").plan_kwargs() == {"fixed_split_size": 64,
                                                                       "disable_split_kv": False}
    for bad in ("cuda-cores:nosplit", "tensor-cores:split=0", "tensor-cores:split", "tensor-cores:64", "cpu"):
        with pytest.raises(ValueError, match="kernel"):
            bench.kernel_split(bad)
    # sub-rows: each unsplit (the plan a CUDA graph holds), their states merged
    assert bench.kernel_split("tensor-cores:parts=4") == DecodeSplit(True, None, True)
    assert bench.kernel_parts("tensor-cores:parts=8") == 8 and bench.kernel_parts("cuda-cores") == 1
    for bad in ("tensor-cores:parts=1", "tensor-cores:parts=4:fp32", "cuda-cores:parts=4", "tensor-cores:parts=x"):
        with pytest.raises(ValueError, match="kernel"):
            bench.kernel_split(bad)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/sparse_kernel_bench.py"), "--kernels",
                           "cuda-cores,tensor-cores:parts=2,tensor-cores:split=0"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "tensor-cores:split=0" in done.stderr, done.stderr[-2000:]


def test_detached_job_leaves_its_exit_status_output_and_log(tmp_path):
    """detached.sh runs a command in a copy of the tree under a session of its own; an `exit` in the command
    still leaves its status, its files under $JOB_OUT and its log, and a second job of one name is refused."""
    script = ["bash", str(ROOT / "benchmarks/gpu_host/detached.sh")]
    env = {"PATH": "/usr/bin:/bin", "DETACHED_ROOT": str(tmp_path / "jobs")}
    work = tmp_path / "tree"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg/code.txt").write_text("v1")

    def call(*args):
        return subprocess.run([*script, *args], cwd=work, env=env, capture_output=True, text=True, timeout=120)

    started = call("start", "job", 'cat pkg/code.txt > "$JOB_OUT/seen"; echo to-the-log; exit 3')
    assert started.returncode == 0, started.stderr
    (work / "pkg/code.txt").write_text("v2")  # the tree changes under the job: it reads its copy
    waited = call("wait", "job", "90")
    assert waited.returncode == 0 and "to-the-log" in waited.stdout and "job ended rc 3" in waited.stdout
    job = tmp_path / "jobs/job"
    assert (job / "rc").read_text().strip() == "3"
    assert (job / "out/seen").read_text() == "v1"
    assert call("start", "job", "true").returncode == 2
    assert call("collect", "job", str(tmp_path / "back")).returncode == 0
    listed = subprocess.run(["tar", "-tzf", str(tmp_path / "back/job.tar.gz")], capture_output=True, text=True).stdout
    assert {"./rc", "./out/seen", "./job.log"} <= set(listed.split()) and "./repo/" not in listed


def test_the_tiny_checkpoint_takes_a_gqa_group_of_four(tmp_path):
    """The GQA-group-4 GPU test's model: 32 query heads over 8 KV heads, the projections shaped to match."""
    import json

    from safetensors import safe_open

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sglang_server as S

    out = S.write_tiny_checkpoint(tmp_path / "g4", seed=0, lm_head_std=0.5, attn_scale=2.0, query_heads=32)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (32, 8)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert list(f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape()) == [32 * 128, cfg["hidden_size"]]
        assert list(f.get_slice("model.layers.0.self_attn.o_proj.weight").get_shape()) == [cfg["hidden_size"], 32 * 128]
    default = json.loads((S.write_tiny_checkpoint(tmp_path / "g2") / "config.json").read_text())
    assert default["num_attention_heads"] == 16


def _collected(*k_args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *k_args,
                           "tests/gpu/test_sparse_kernels.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: every test deselected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_suite_s_kernel_shards_are_the_whole_module_each_test_once():
    """`run_gpu_suite.sh all` runs the sparse-kernel module as three pytest runs (-k LONG_ROWS, -k AT_40K and -k REST):
    together they are every test of the module, none empty, none in two."""
    script = (ROOT / "benchmarks/gpu_host/run_gpu_suite.sh").read_text()
    exprs = {line.split("=", 1)[0]: line.split("=", 1)[1].strip('"') for line in script.splitlines()
             if line.startswith("KERNEL_") and "_EXPR=" in line}
    names = ["KERNEL_LONG_ROWS_EXPR", "KERNEL_AT_40K_EXPR", "KERNEL_REST_EXPR"]
    assert sorted(exprs) == sorted(names) and all(f'"${name}"' in script for name in names)
    rest = exprs["KERNEL_REST_EXPR"].replace("$KERNEL_LONG_ROWS_EXPR", exprs["KERNEL_LONG_ROWS_EXPR"])
    rest = rest.replace("$KERNEL_AT_40K_EXPR", exprs["KERNEL_AT_40K_EXPR"])
    whole = _collected()
    shards = [_collected("-k", expr) for expr in (exprs["KERNEL_LONG_ROWS_EXPR"], exprs["KERNEL_AT_40K_EXPR"], rest)]
    assert all(shards) and sum(len(shard) for shard in shards) == len(whole)
    assert set().union(*shards) == whole and len(whole) > 60


def _modules_of_part(script: str, part: str) -> list[str]:
    """The `module GPUS NAME [SHARD]` runs of `run_gpu_suite.sh PART` (its case branch), as NAME or NAME-SHARD;
    on one GPU part 3's else branch."""
    branch = script[script.index(f"\n  {part})\n"):]
    branch = branch[:branch.index(";;")]
    if "else" in branch:
        branch = branch[branch.index("else"):]
    runs = re.findall(r'module ("\$G"|[0-9,]+) (\w+)(?: (\w+) ")?', branch)
    return [name + (f"-{shard}" if shard else "") for _, name, shard in runs]


def test_the_suite_s_parts_run_every_gpu_module_once():
    """`all` on two GPUs and parts 1, 2 and 3 on one run every tests/gpu module, the kernel module in its three shards,
    each once (none forgotten when a module is added)."""
    script = (ROOT / "benchmarks/gpu_host/run_gpu_suite.sh").read_text()
    shards = {"sparse_kernels-long_rows", "sparse_kernels-at_40k", "sparse_kernels-rest"}
    expected = {p.stem.removeprefix("test_") for p in (ROOT / "tests/gpu").glob("test_*.py")}
    expected = expected - {"sparse_kernels"} | shards
    one_gpu = [run for part in "123" for run in _modules_of_part(script, part)]
    for runs in (_modules_of_part(script, "all"), one_gpu + ["sglang_tp"]):  # on one GPU the TP tests skip
        assert sorted(runs) == sorted(expected), runs
