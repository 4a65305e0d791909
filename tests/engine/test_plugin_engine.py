"""CPU tests of ``SGLangEngine`` (translation to and from SGLang, KV budgets, adapters, dense
verification) and of its host (``serve --engine sglang``: SGLang's app with the sparrow app
mounted), with a fake tokenizer manager (``tests/helpers/fake_sglang.py``)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from helpers.fake_sglang import FakeRuntime
from sparrow_server.cli import main as cli_main
from sparrow_server.engine.adapter_versions import AdapterManager
from sparrow_server.engine.base import ContextLengthError, GenerationRequest, SamplingParams, UnknownAdapterError
from sparrow_server.server.app import create_app
from sparrow_server.sglang_plugin.config import PluginConfig
from sparrow_server.sglang_plugin.frontend.engine import SGLangEngine, StreamState, sampling_dict
from sparrow_server.sglang_plugin.frontend.host import mount_sparrow, serve_weight_version, sglang_argv
from sparrow_server.sglang_plugin.scheduler.planning import plan_step
from sparrow_server.sglang_plugin.frontend.verification import SGLangDenseScorer, dense_prefill_kwargs, topk_from_prefill_meta
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import parse_schedule_text, schedule_from_dict
from sparrow_server.stats import exact_wire
from sparrow_server.stats.exact_subsample import KeptPositions

SPARSE = "qwen3-1.7b-0.86"


def _collect(engine, req):
    async def run():
        return [c async for c in engine.submit(req)]
    return asyncio.run(run())


@pytest.mark.parametrize("incremental", [False, True])
def test_stream_chunks_are_deltas_with_planned_budgets(incremental):
    rt = FakeRuntime(chunk_tokens=3, incremental=incremental)
    eng = SGLangEngine(rt)
    sched = ScheduleRegistry().get(SPARSE)
    prompt = tuple(range(1, 1200))  # past the 512-token budget of the first bin: sparse steps
    req = GenerationRequest(rid="r1", input_ids=prompt, sampling=SamplingParams(max_new_tokens=7, seed=3), schedule=sched)
    chunks = _collect(eng, req)
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == [(sum(prompt) + i) % 64 for i in range(7)]
    assert chunks[-1].done and chunks[-1].finish.type == "length" and chunks[-1].completion_tokens == 7
    budgets = [b for c in chunks for b in c.kv_budget_tokens]
    lengths = np.array([len(prompt) + j for j in range(1, 7)])
    plan = plan_step([sched] * 6, lengths, np.full(6, len(prompt)), num_kv_heads=8, page_size=16, topk_cap_pages=1 << 16)
    assert budgets[0] is None and budgets[1:] == plan.budget_tokens.tolist()
    assert all(b < len(prompt) for b in budgets[1:])  # really sparse at this length
    sp = rt.calls[0]["sampling_params"]
    assert parse_schedule_text(sp["custom_params"]["sparrow_schedule_json"]) == sched
    assert sp["sampling_seed"] == 3 and rt.calls[0]["stream"] and rt.calls[0]["rid"] == "r1"
    assert rt.calls[0]["top_logprobs_num"] is None and chunks[0].top_logprobs is None
    assert eng.live_requests() == () and rt.aborted == []


def test_closing_early_aborts():
    rt = FakeRuntime()
    eng = SGLangEngine(rt)

    async def run():
        it = eng.submit(GenerationRequest(rid="r2", input_ids=(1,)))
        first = await it.__anext__()
        await it.aclose()
        return first
    assert len(asyncio.run(run()).token_ids) == 2
    assert rt.aborted == ["r2"]


def test_validate_context_and_adapter():
    eng = SGLangEngine(FakeRuntime(context_length=10), adapters=(("a", "/adapters/a"),))
    with pytest.raises(ContextLengthError):
        eng.validate(GenerationRequest(rid="x", input_ids=(1,) * 5, sampling=SamplingParams(max_new_tokens=6)))
    with pytest.raises(UnknownAdapterError):
        eng.validate(GenerationRequest(rid="x", input_ids=(1,), adapter="b", sampling=SamplingParams(max_new_tokens=2)))
    eng.validate(GenerationRequest(rid="x", input_ids=(1,), adapter="a", sampling=SamplingParams(max_new_tokens=2)))


def test_recorded_topk_is_requested_and_returned():
    rt = FakeRuntime()
    chunks = _collect(SGLangEngine(rt), GenerationRequest(rid="v", input_ids=(1, 2), record_topk=20, top_logprobs=3,
                                                           sampling=SamplingParams(max_new_tokens=4)))
    assert rt.calls[0]["top_logprobs_num"] == 20
    assert [len(row) for c in chunks for row in c.top_logprobs] == [20] * 4


@pytest.mark.parametrize("incremental", [False, True])
def test_prompt_logprobs_arrive_once_in_the_engine_shape(incremental):
    """SGLang repeats input logprobs in every streamed output; the engine passes them on once."""
    rt = FakeRuntime(chunk_tokens=2, incremental=incremental)
    req = GenerationRequest(rid="p", input_ids=(5, 6, 7, 8), logprob_start_len=1, top_logprobs=2,
                            sampling=SamplingParams(max_new_tokens=5))
    chunks = _collect(SGLangEngine(rt), req)
    assert rt.calls[0]["logprob_start_len"] == 1
    with_prompt = [c for c in chunks if c.prompt_logprobs is not None]
    assert len(with_prompt) == 1 and with_prompt[0] is chunks[0]
    want = rt._prompt_rows([5, 6, 7, 8], 1, 2)
    assert list(chunks[0].prompt_logprobs) == [row[0] for row in want["input_token_logprobs"]]
    assert chunks[0].prompt_logprobs[0] is None and len(chunks[0].prompt_logprobs) == 3
    assert chunks[0].prompt_top_logprobs[0] is None
    assert [[(lp, i) for lp, i, _ in row] for row in want["input_top_logprobs"][1:]] == \
        [list(row) for row in chunks[0].prompt_top_logprobs[1:]]
    plain = FakeRuntime()
    assert all(c.prompt_logprobs is None for c in _collect(SGLangEngine(plain), GenerationRequest(rid="q", input_ids=(1,))))
    assert plain.calls[0]["logprob_start_len"] == -1  # SGLang's "output logprobs only"


def test_scoring_only_request_on_sglang():
    rt = FakeRuntime()
    chunks = _collect(SGLangEngine(rt), GenerationRequest(rid="z", input_ids=(3, 4, 5), logprob_start_len=0,
                                                           sampling=SamplingParams(max_new_tokens=0)))
    assert len(chunks) == 1 and chunks[0].token_ids == () and chunks[0].finish.type == "length"
    assert len(chunks[0].prompt_logprobs) == 3 and rt.calls[0]["sampling_params"]["max_new_tokens"] == 0


def test_dense_request_sends_no_schedule_when_none():
    assert "custom_params" not in sampling_dict(GenerationRequest(rid="x", input_ids=(1,)))
    assert StreamState(GenerationRequest(rid="x", input_ids=(1,))).sent == 0


def test_weight_version_follows_sglang_meta():
    rt = FakeRuntime(weight_version="step-7")
    eng = SGLangEngine(rt)
    chunks = _collect(eng, GenerationRequest(rid="w", input_ids=(1,), sampling=SamplingParams(max_new_tokens=2)))
    assert chunks[-1].weight_version == "step-7" and eng.info().weight_version == "step-7"


# ----- adapters: SGLang's LoRA pool, driven from the adapter manager's worker thread ---------------
def test_adapter_load_and_unload_run_on_the_engine_loop():
    rt = FakeRuntime()
    eng = SGLangEngine(rt)

    async def run():
        await eng.start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, eng.load_adapter, "distill-v1", "/adapters/v1")
        assert eng.adapters() == ("distill-v1",) and rt.loras == {"distill-v1": "/adapters/v1"}
        await loop.run_in_executor(None, eng.unload_adapter, "distill-v1")
    asyncio.run(run())
    assert rt.lora_events == [("load", "distill-v1"), ("unload", "distill-v1")] and eng.adapters() == ()
    with pytest.raises(RuntimeError, match="not started"):
        SGLangEngine(FakeRuntime()).load_adapter("x", "/p")


def _adapter_dir(root, name):
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                      "target_modules": ["q_proj", "v_proj"]}))
    (d / "adapter_model.safetensors").write_bytes(b"")  # SGLang (faked here) reads it, not the manager
    return str(d)


def test_adapter_unloads_from_sglang_only_after_its_last_request(tmp_path):
    rt = FakeRuntime(chunk_tokens=1)
    rt.token_delay_s = 0.02
    eng = SGLangEngine(rt, adapters=(("boot", _adapter_dir(tmp_path, "boot")),))
    manager = AdapterManager(eng)
    manager.adopt_loaded()  # SGLang's --lora-paths adapters become versions
    assert manager.names() == ("boot",)

    async def run():
        await eng.start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, manager.load, "v1", _adapter_dir(tmp_path, "v1"))
        manager.set_alias("distill-latest", "v1")
        version = manager.acquire("distill-latest")
        req = GenerationRequest(rid="a", input_ids=(1,), adapter=version, sampling=SamplingParams(max_new_tokens=10))

        async def stream():
            try:
                return [c async for c in eng.submit(req)]
            finally:
                manager.release(version)
        task = asyncio.create_task(stream())
        await asyncio.sleep(0.05)
        manager.delete_alias("distill-latest")
        unload = asyncio.create_task(manager.unload("v1"))
        await asyncio.sleep(0.05)
        assert ("unload", "v1") not in rt.lora_events and not task.done()  # still draining
        chunks = await task
        await unload
        return chunks
    chunks = asyncio.run(run())
    assert sum(len(c.token_ids) for c in chunks) == 10 and chunks[-1].adapter == "v1"
    assert rt.lora_events == [("load", "v1"), ("unload", "v1")] and rt.calls[0]["lora_path"] == "v1"
    assert eng.adapters() == ("boot",)


# ----- dense verification on SGLang --------------------------------------------------------------
def test_dense_prefill_is_dense_adapter_free_and_prefill_only():
    kw = dense_prefill_kwargs([1, 2, 3], [4, 5], k=20)
    assert kw["input_ids"] == [1, 2, 3, 4, 5] and kw["lora_path"] is None
    assert kw["sampling_params"]["max_new_tokens"] == 0 and kw["logprob_start_len"] == 2
    assert parse_schedule_text(kw["sampling_params"]["custom_params"]["sparrow_schedule_json"]).is_dense


def test_prefill_topk_lines_up_with_completion():
    rt = FakeRuntime()
    out = asyncio.run(rt.generate(**dense_prefill_kwargs([9, 8, 7], [4, 5, 6], k=5)))
    ids, lps = topk_from_prefill_meta(out["meta_info"], [4, 5, 6], 5)
    assert ids.shape == (3, 5) and ids[0, 0].item() == 3 and ids[2, 0].item() == 5  # positions 3..5
    with pytest.raises(ValueError, match="line up"):
        topk_from_prefill_meta(out["meta_info"], [4, 5, 7], 5)


def _loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_scorer_runs_on_engine_loop_and_refuses_other_temperatures():
    loop, thread = _loop_thread()
    try:
        scorer = SGLangDenseScorer(FakeRuntime(), lambda: loop)
        ids, lps = scorer.dense_topk([1, 2], [3, 4], 20, 1.0)
        assert ids.shape == (2, 20) and float(lps[0].exp().sum()) == pytest.approx(1.0, abs=1e-5)
        with pytest.raises(ValueError, match="temperature"):
            scorer.dense_topk([1, 2], [3, 4], 20, 0.7)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


# ----- the host: SGLang's app with the sparrow app mounted under it ------------------------------
def _sglang_stand_in(events: list[str]) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("sglang up")
        yield
        events.append("sglang down")

    app = FastAPI(lifespan=lifespan)

    @app.post("/generate")
    async def generate():
        return {"served_by": "sglang"}

    @app.get("/health")
    async def health():
        return {"served_by": "sglang"}
    return app


def _hosted(rt: FakeRuntime, exact_stride: int = 0, **app_kwargs):
    events: list[str] = []
    outer = _sglang_stand_in(events)
    engine = SGLangEngine(rt, config=PluginConfig(exact_stride=exact_stride))
    mount_sparrow(outer, create_app(engine, ScheduleRegistry(), **app_kwargs))
    return outer, engine, events


def test_sglang_routes_win_and_sparrow_routes_fall_through():
    outer, engine, events = _hosted(FakeRuntime())
    with TestClient(outer) as client:
        assert engine.loop is not None and events == ["sglang up"]  # sparrow's lifespan ran inside SGLang's
        assert client.post("/generate", json={}).json() == {"served_by": "sglang"}
        assert client.get("/health").json() == {"served_by": "sglang"}
        r = client.post("/rollout", json={"input_ids": list(range(1, 1200)), "schedule": SPARSE,
                                          "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
        assert r.status_code == 200, r.text
        meta = r.json()["meta"]
        assert meta["schedule"] == SPARSE and 0 < meta["kv_budget_tokens_mean"] < 1200
        assert client.get("/schedules").status_code == 200
        assert "sparrow_requests_total" in client.get("/metrics").text
    assert events == ["sglang up", "sglang down"]


def test_sglang_404_weight_version_routes_are_replaced_in_place():
    """SGLang 0.5.17 answers /get_weight_version and /weight_version with 404 (http_server.py);
    slime main reads the first. Replaced where they stand, so the mounted sparrow app stays behind."""
    from fastapi import HTTPException

    outer = _sglang_stand_in([])

    @outer.get("/get_weight_version")
    @outer.get("/weight_version")
    async def weight_version():
        raise HTTPException(status_code=404, detail="moved to /model_info")

    versions = iter(["step-1", "step-2"])
    assert serve_weight_version(outer, lambda: next(versions)) == 2
    mount_sparrow(outer, create_app(SGLangEngine(FakeRuntime()), ScheduleRegistry()))
    with TestClient(outer) as client:
        assert client.get("/get_weight_version").json() == {"weight_version": "step-1"}
        assert client.get("/weight_version").json() == {"weight_version": "step-2"}
        assert client.post("/default_schedule", json={"name": "dense"}).status_code == 409  # fixed at start


def test_verified_rollout_on_sglang_reports_topk_acceptance_without_the_adapter():
    rt = FakeRuntime()
    outer, engine, _ = _hosted(rt, verify_fraction=0.0)
    with TestClient(outer) as client:
        body = {"input_ids": [1, 2, 3], "verify": True, "top_logprobs": 2,
                "sampling_params": {"max_new_tokens": 6, "temperature": 1.0}}
        out = client.post("/rollout", json=body).json()
        assert out["meta"]["acceptance_kind"] == "topk_lower_bound" and out["meta"]["verified_tokens"] == 6
        assert out["meta"]["acceptance_p5"] > 0.999  # same distribution on both sides
        assert [len(t) for t in out["top_logprobs"]] == [2] * 6  # the client gets what it asked for
        rt.dense_shift = 1.5  # now the dense pass disagrees: the acceptance must drop
        out = client.post("/rollout", json=body).json()
        assert out["meta"]["acceptance_p5"] < 0.95
        plain = client.post("/rollout", json={**body, "verify": False}).json()
        assert "acceptance_p5" not in plain["meta"] and "top_logprobs" in plain
    prefills = [c for c in rt.calls if c.get("sampling_params", {}).get("max_new_tokens") == 0]
    assert len(prefills) == 2 and all(c["lora_path"] is None for c in prefills)
    decodes = [c for c in rt.calls if c not in prefills]
    assert [c["top_logprobs_num"] for c in decodes] == [20, 20, 2]


def test_verified_rollout_on_sglang_reads_exact_values_at_kept_positions_and_keeps_the_bound():
    """With exact acceptance on a subsample, the evidence (meta, metrics) is the exact values at the kept
    positions, and the top-k bound of the same positions stays reported as such; nothing is recorded per
    token (no top-k while decoding, none in the verify prefill); without the payload the rollout is
    reported unscored, with the reason."""
    rt = FakeRuntime()
    outer, engine, _ = _hosted(rt, exact_stride=2, verify_fraction=0.0)
    with TestClient(outer) as client:
        body = {"input_ids": [1, 2, 3], "verify": True, "sampling_params": {"max_new_tokens": 12, "temperature": 1.0}}
        rt.dense_shift = 1.5
        meta = client.post("/rollout", json=body).json()["meta"]
        assert meta["acceptance_kind"] == "exact" and meta["verified_tokens"] == 6  # every 2nd of 12
        assert meta["exact_missing_tokens"] == 0
        assert meta["acceptance_lower_bound_p5"] <= meta["acceptance_p5"] + 1e-9  # a bound, below the exact
        sparse_call = next(c for c in rt.calls if c.get("stream"))
        kept = sparse_call["sampling_params"]["custom_params"][exact_wire.KEEP_PARAM]
        assert kept["stride"] == 2 and kept["offset"] in (0, 1) and isinstance(kept["seed"], int)  # jittered
        # the evidence comes back with the response: the kept positions (as sent) and their exact values
        sub = meta["exact_subsample"]
        assert {k: sub[k] for k in ("offset", "stride", "seed")} == kept
        assert sub["positions"] == KeptPositions.from_dict(kept).positions(12).tolist() and sub["missing"] == []
        assert len(sub["acceptance"]) == 6
        assert float(np.quantile(sub["acceptance"], 0.05)) == pytest.approx(meta["acceptance_p5"])
        assert len(sub["bound"]) == 6 and all(b <= a + 1e-9 for a, b in zip(sub["acceptance"], sub["bound"]))
        assert float(np.quantile(sub["bound"], 0.05)) == pytest.approx(meta["acceptance_lower_bound_p5"])
        assert sparse_call["top_logprobs_num"] is None  # nothing recorded per token while decoding
        verify_call = next(c for c in rt.calls if not c.get("stream"))
        assert verify_call["sampling_params"]["max_new_tokens"] == 1  # customized_info needs one output token
        assert "top_logprobs_num" not in verify_call and verify_call["logprob_start_len"] == -1  # no per-position lists
        assert verify_call["sampling_params"]["custom_params"][exact_wire.VERIFY_PARAM]["k"] == 20
        assert verify_call["sampling_params"]["custom_params"][exact_wire.VERIFY_PARAM]["rid"] == sparse_call["rid"]
        text = client.get("/metrics").text
        assert "sparrow_verified_tokens_total" in text and 'sparrow_verified_tokens_total{schedule="dense"} 6.0' in text
        rt.exact_payload = False  # the hooks did not run: no evidence; the rollout is counted unscored, with why
        meta = client.post("/rollout", json=body).json()["meta"]
        assert "acceptance_kind" not in meta and "exact_subsample" not in meta
        assert exact_wire.RESULT_KEY in meta["acceptance_error"], meta
        text = client.get("/metrics").text
        assert 'sparrow_verified_tokens_total{schedule="dense"} 6.0' in text
        assert 'sparrow_verified_unscored_tokens_total{schedule="dense"} 12.0' in text


def test_sglang_argv_owns_backend_flags():
    argv = sglang_argv("/m", "127.0.0.1", 30001, adapters=(("a", "/p"),), max_batch_size=8,
                       extra=("--mem-fraction-static", "0.8"))
    assert argv[argv.index("--attention-backend") + 1] == "sparrow" and argv[argv.index("--page-size") + 1] == "16"
    assert argv[argv.index("--lora-paths") + 1] == "a=/p" and argv[-2:] == ["--mem-fraction-static", "0.8"]
    assert argv[argv.index("--max-running-requests") + 1] == "8"
    for bad in ("--attention-backend", "--page-size=32"):
        with pytest.raises(ValueError, match="set by sparrow-server"):
            sglang_argv("/m", "h", 1, extra=(bad, "x"))


def test_serve_refuses_unknown_flags_without_sglang(capsys):
    assert cli_main(["serve", "--engine", "reference", "--mem-fraction-static", "0.8"]) == 2
    assert "need --engine sglang" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["schedules", "list", "--no-such-flag"])


def test_serve_sglang_command_line(tmp_path):
    from sparrow_server.cli import build_parser
    from sparrow_server.commands.serve import sglang_command

    argv = ["serve", "--engine", "sglang", "--model", "/m", "--port", "31001", "--max-lora-rank", "8",
            "--state-dir", str(tmp_path), "--default-schedule", SPARSE, "--", "--mem-fraction-static", "0.8",
            "--enable-lora", "--lora-target-modules", "q_proj", "v_proj"]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra.remove("--")
    args.extra_args = extra
    sgl, env, _ = sglang_command(args)
    assert sgl[:4] == ["--model-path", "/m", "--host", "127.0.0.1"] and "--api-key" not in sgl
    assert sgl[sgl.index("--lora-target-modules") + 1:sgl.index("--lora-target-modules") + 3] == ["q_proj", "v_proj"]
    assert sgl[sgl.index("--max-lora-rank") + 1] == "8"  # one rank limit for SGLang's pool and POST /adapters
    assert env["SPARROW_DEFAULT_SCHEDULE"] == SPARSE and env["SPARROW_SCHEDULE_DIR"].startswith(str(tmp_path))


def test_verification_across_a_weight_update_is_dropped_not_scored():
    rt = FakeRuntime(weight_version="step-1")
    outer, engine, _ = _hosted(rt, verify_fraction=0.0)
    real_generate = rt.generate

    async def generate_after_update(**kw):
        rt.weight_version = "step-2"  # the weights change between the rollout and its dense pass
        return await real_generate(**kw)
    rt.generate = generate_after_update
    with TestClient(outer) as client:
        out = client.post("/rollout", json={"input_ids": [1, 2, 3], "verify": True,
                                            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0}}).json()
        verifier = outer.routes[-1].app.state.service.verifier
    assert out["meta"]["weight_version"] == "step-1" and "acceptance_p5" not in out["meta"]
    assert "StaleVerificationError" in out["meta"]["acceptance_error"] and verifier.stale == 1


def test_schedules_with_other_dense_layers_are_accepted(monkeypatch, tmp_path):
    """The backend honours a request's extra dense layers (dense by budget on the server's sparse layers)
    and runs the server's dense layers dense for everyone: schedules with more or fewer dense layers are
    accepted on PUT /schedules and /rollout."""
    from sparrow_server.sglang_plugin.config import ENV_DEFAULT_SCHEDULE, ENV_SCHEDULE_DIR

    monkeypatch.setenv(ENV_DEFAULT_SCHEDULE, SPARSE)
    monkeypatch.setenv(ENV_SCHEDULE_DIR, str(tmp_path))
    outer, engine, _ = _hosted(FakeRuntime())
    assert engine.dense_layers == ScheduleRegistry().get(SPARSE).dense_layers == (0, 1)
    more = {"budgets_tokens": [512], "dense_layers": [0, 1, 5]}
    fewer = {"budgets_tokens": [512], "dense_layers": [0]}
    with TestClient(outer) as client:
        assert client.put("/schedules/more-dense", json=more).status_code == 200
        assert client.put("/schedules/fewer-dense", json=fewer).status_code == 200
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        for name in ("more-dense", "fewer-dense", "dense"):
            assert client.post("/rollout", json={**body, "schedule": name}).status_code == 200, name
    engine.validate(GenerationRequest(rid="m", input_ids=(1,), schedule=schedule_from_dict({**more, "name": "m"})))


def test_scheduler_notes_once_a_schedule_that_runs_denser_than_asked(caplog):
    """Extra dense layers are honoured (nothing logged); fewer than the server's run dense: logged once."""
    from sparrow_server.sglang_plugin.scheduler.side_table import ScheduleTable

    table = ScheduleTable(8, default=ScheduleRegistry().get(SPARSE))
    more = schedule_from_dict({"name": "more", "budgets_tokens": [512], "dense_layers": [0, 1, 3]})
    fewer = schedule_from_dict({"name": "fewer", "budgets_tokens": [512], "dense_layers": [1]})
    with caplog.at_level("INFO"):
        table.assign(1, more, 10)
        table.assign(2, fewer, 10)
        table.assign(3, fewer, 10)
        table.assign(4, ScheduleRegistry().get("dense"), 10)
    notes = [r.getMessage() for r in caplog.records if "sparrow_server" in r.name]
    assert not [m for m in notes if "more@" in m]
    assert len([m for m in notes if "fewer@" in m and "layers [0]" in m]) == 1, notes


def test_app_is_built_before_sglang_is_up():
    """serve --engine sglang builds the sparrow app before SGLang's tokenizer manager exists (seen on the
    GPU host: create_app read engine.info() and the server exited); routes read it per request."""
    class NotUpYet(FakeRuntime):
        up = False

        def model_facts(self):
            if not self.up:
                raise RuntimeError("SGLang's tokenizer manager is not up yet")
            return super().model_facts()

    rt = NotUpYet()
    app = create_app(SGLangEngine(rt), ScheduleRegistry())
    rt.up = True
    with TestClient(app) as c:
        r = c.post("/update_weights_from_tensor", json={})
    assert r.status_code == 400 and "sglang" in r.json()["message"].lower()
