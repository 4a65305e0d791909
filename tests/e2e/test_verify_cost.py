"""benchmarks/verify_cost.py (a GPU script): its arithmetic, its request batches, and --help without SGLang."""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import verify_cost as V  # noqa: E402


def test_the_cost_is_the_verified_batch_over_the_mean_plain_one():
    c = V.cost_summary([10.0, 12.0], 14.0, generated_tokens=1000, kept_tokens=62, vocab=151936)
    assert c["plain_wall_mean_s"] == 11.0 and c["extra_s"] == 3.0
    assert c["extra_us_per_generated_token"] == 3000.0 and c["extra_us_per_kept_token"] == round(3e6 / 62, 3)
    assert c["verify_share_of_verified_wall"] == round(3 / 14, 4) and c["plain_drift"] == round(2 / 11, 4)
    assert c["kept_rows_bytes_all"] == 2 * 151936 * 62


@pytest.mark.parametrize("bad", [dict(plain_walls=[]), dict(generated_tokens=0), dict(kept_tokens=0)])
def test_nothing_to_divide_by_is_an_error_naming_it(bad):
    kwargs = dict(plain_walls=[1.0], verified_wall=2.0, generated_tokens=10, kept_tokens=1, vocab=8) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        V.cost_summary(**kwargs)


def test_every_batch_sends_the_same_prompts_and_seeds_and_only_verify_differs():
    plain = V.rollout_requests(3, 5, 7, vocab=1000, schedule="s", verify=False)
    verified = V.rollout_requests(3, 5, 7, vocab=1000, schedule="s", verify=True)
    assert [r["input_ids"] for r in plain] == [r["input_ids"] for r in verified]
    assert all(not p["verify"] and v["verify"] for p, v in zip(plain, verified))
    assert [r["sampling_params"]["seed"] for r in plain] == [0, 1, 2]
    assert all(100 <= t < 900 for r in plain for t in r["input_ids"])  # clear of the vocabulary's ends
    assert len({tuple(r["input_ids"]) for r in plain}) == 3


def test_the_row_bound_holds_a_whole_batch_of_kept_rows():
    mib = V.rows_mib(32, 8192, 16, 151936)
    need = 32 * 512 * 2 * 151936
    assert need < mib * (1 << 20) < 1.3 * need and mib > 4096  # the default bound (4,096 MiB) would refuse rows


def test_kept_positions_are_counted_from_each_response():
    def result(positions):
        return types.SimpleNamespace(meta=types.SimpleNamespace(raw={"exact_subsample": {"positions": positions}}))
    assert V.kept_count([result([1, 17]), result([5]), types.SimpleNamespace(meta=types.SimpleNamespace(raw={}))]) == 3


def test_help_answers_without_the_gpu_stack():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_cost.py"), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "per verified token" in " ".join(out.stdout.split())


def test_the_server_command_passes_sparrow_servers_own_checks(tmp_path):
    # gpu_call19: the first GPU run died at start, its flags carried --page-size, which `serve` owns
    import sglang_server as S
    from sparrow_server.cli import build_parser
    from sparrow_server.commands.serve import sglang_command

    server = S.Server(tmp_path / "m", V.server_args(32, tmp_path / "state", "--chunked-prefill-size 8192"),
                      tmp_path / "log", sparrow=True)
    assert server.cmd[1:3] == ["-m", "sparrow_server.cli"]
    args, extra = build_parser().parse_known_args(server.cmd[3:])
    args.extra_args = extra
    sglang_argv, _, _ = sglang_command(args)
    assert sglang_argv.count("--page-size") == 1 and "--verify-fraction" not in sglang_argv
    assert args.verify_fraction == 0 and args.max_batch_size == 32
    assert sglang_argv[sglang_argv.index("--chunked-prefill-size") + 1] == "8192"


def test_the_prefill_probe_sends_the_products_verify_prefill_then_strips_one_part_at_a_time():
    from sparrow_server.monitor.verifier import DEFAULT_RECORD_TOPK
    from sparrow_server.sglang_plugin.frontend.verification import dense_prefill_kwargs

    v = V.prefill_probe_payloads([5, 6, 7], [8, 9])
    assert v["top_k"] == dense_prefill_kwargs([5, 6, 7], [8, 9], DEFAULT_RECORD_TOPK)
    assert v["top_k"]["input_ids"] == [5, 6, 7, 8, 9] and v["top_k"]["top_logprobs_num"] > 0
    assert v["top_k"]["logprob_start_len"] == 2 and v["top_k"]["return_logprob"] is True
    assert "top_logprobs_num" not in v["token_logprobs"] and v["token_logprobs"]["logprob_start_len"] == 2
    assert v["no_logprobs"]["return_logprob"] is False and "logprob_start_len" not in v["no_logprobs"]
    assert all(p["sampling_params"] == v["top_k"]["sampling_params"] for p in v.values())  # the same dense step


def test_the_probe_times_every_variant_of_every_pair_in_turn():
    sent = []
    client = types.SimpleNamespace(generate=lambda payload: sent.append(payload))
    out = V.probe_prefills(client, [([1, 2], [3]), ([4, 5], [6, 7])])
    assert sorted(out) == ["no_logprobs", "token_logprobs", "top_k"]
    assert all(len(o["seconds"]) == 2 for o in out.values())
    assert [p["input_ids"] for p in sent] == [[1, 2, 3]] * 3 + [[4, 5, 6, 7]] * 3


def test_the_service_takes_every_probe_payload(model_dir, tmp_path, one_torch_thread):
    # the probe goes through the served /generate (SparrowClient.generate): a 4xx would end the GPU call
    from fastapi.testclient import TestClient

    from helpers.server_util import CharTokenizer
    from helpers.tiny_models import TINY_VOCAB, load_plain
    from sparrow_server.client.common import generate_payload
    from sparrow_server.engine.reference import ReferenceEngine
    from sparrow_server.server.app import create_app
    from sparrow_server.sparsity.registry import ScheduleRegistry

    tokenizer = CharTokenizer()
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), tokenizer, "tiny", kv_pool_tokens=4096)
    app = create_app(engine, ScheduleRegistry.load(persist_dir=tmp_path / "schedules"), tokenizer=tokenizer)
    prompt, completion = [(7 * i) % (TINY_VOCAB - 1) + 1 for i in range(20)], [3, 4, 5, 6]
    with TestClient(app) as client:
        for name, payload in V.prefill_probe_payloads(prompt, completion).items():
            r = client.post("/generate", json=generate_payload(payload))
            assert r.status_code == 200, (name, r.text)
            meta = r.json()["meta_info"]
            assert bool(meta.get("input_token_logprobs")) == (name != "no_logprobs"), name
            assert bool(meta.get("input_top_logprobs")) == (name == "top_k"), name


def test_the_topk_conversion_timing_compares_the_same_tensors():
    """benchmarks/topk_conversion.py (the timing behind the verify-cost attribution) runs on CPU and both
    conversions give the same tensors."""
    import json

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "benchmarks/topk_conversion.py"), "--tokens", "64", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["same_tensors"] is True and out["tokens"] == 64 and out["element_at_a_time_s"] > 0
