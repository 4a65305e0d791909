"""The trainers' own requests, replayed against a live reference server (uvicorn in this process),
and their answers parsed the way each client parses them.

Payloads and parsing were written from reading the clients' sources:
- slime THUDM/slime@624b824 (2026-08-21): ``slime/backends/sglang_utils/server_control.py``
  (``abort_server_until_idle``: ``POST /abort_request {"abort_all": true}`` then ``GET
  /v1/loads?include=core`` until ``num_requests_from_load`` is 0), ``sglang_engine.py``
  (``flush_cache``: ``GET /flush_cache`` until 200; ``get_weight_version``; ``release/resume_memory_occupation``;
  ``check_weights``; ``_make_request`` = ``requests.post(url, json=payload or {})`` then ``.json()``),
  ``external.py`` (``get_server_info``, ``parallel_config``), ``slime/rollout/sglang_rollout.py``
  (the ``/generate`` payload and ``output["meta_info"]["output_token_logprobs"]``, ``output["text"]``).
- verl volcengine/verl@b178a3c: ``verl/workers/rollout/sglang_rollout/http_server_engine.py``
  (``_read_response``; ``generate`` payload with None values dropped; ``abort_request {"rid": "",
  "abort_all": ...}``; ``release/resume_memory_occupation {"tags": ...}``; start-up ``/health_generate``
  then ``/flush_cache``).
- SGLang 0.5.17 frontend: ``sglang/lang/backend/runtime_endpoint.py`` (``generate``) and ``lang/ir.py``
  (``SglSamplingParams.to_srt_kwargs``): ``stop_regex: []``, ``stop: []``, ``json_schema``/``regex`` null.
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.engine_brake import LoopPark
from helpers.live_server import live_server, wait_until
from helpers.server_util import CharTokenizer
from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.control import HEALTH_CHECK_TIMEOUT_S

PROMPT = [(5 * i + 2) % (TINY_VOCAB - 1) + 1 for i in range(40)]
LONG = 64  # tokens of a long rollout: it is parked (``parked_rollout``) well before its end
PARK_AT = 3  # tokens the long rollout has when the engine's loop is parked


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer-compat")
    return {"a": save_tiny_model(root / "a", seed=0), "b": save_tiny_model(root / "b", seed=1)}


@pytest.fixture(scope="module")
def server(ckpt, one_torch_thread):
    tokenizer = CharTokenizer()
    engine = ReferenceEngine(load_plain(ckpt["a"], "sdpa"), tokenizer, "tiny", kv_pool_tokens=4096)
    with live_server(create_app(engine, tokenizer=tokenizer)) as live:
        live.engine = engine
        yield live


# ----- the clients' helpers, as they are written ----------------------------------------------------
def slime_num_requests_from_load(load) -> int:
    """slime server_control.num_requests_from_load."""
    if isinstance(load, list):
        return sum(slime_num_requests_from_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return slime_num_requests_from_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return load[key]
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return (running if isinstance(running, int) else 0) + (waiting if isinstance(waiting, int) else 0)


def slime_make_request(url: str, endpoint: str, payload: dict | None = None):
    """slime SGLangEngine._make_request."""
    response = httpx.post(f"{url}/{endpoint}", json=payload or {}, timeout=60)
    response.raise_for_status()
    return response.json()


def slime_flush_cache(url: str) -> None:
    """slime SGLangEngine.flush_cache: GET until 200 (60 tries)."""
    for _ in range(60):
        if httpx.get(f"{url}/flush_cache", timeout=30).status_code == 200:
            return
        wait_until(lambda: True, 0.1)
    raise TimeoutError("Timeout while flushing cache.")


def slime_sampling_params(**over) -> dict:
    """slime's rollout sampling params (GenerateState.__init__), greedy for comparisons."""
    return {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8, "stop": None, "stop_token_ids": None,
            "skip_special_tokens": True, "no_stop_trim": True, "spaces_between_special_tokens": False, **over}


def slime_generate(url: str, sampling_params: dict) -> tuple[list[int], list[float], str, dict]:
    output = slime_make_request(url, "generate", {"sampling_params": sampling_params, "return_logprob": True,
                                                  "input_ids": PROMPT})
    tokens = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
    logprobs = [item[0] for item in output["meta_info"]["output_token_logprobs"]]
    return tokens, logprobs, output["text"], output["meta_info"]


def verl_read_response(response: httpx.Response):
    """verl http_server_engine._read_response."""
    if response.status_code == 204 or not response.content:
        return {}
    try:
        return response.json()
    except ValueError:
        return {"content_type": response.headers.get("Content-Type", ""), "text": response.text}


def verl_request(url: str, endpoint: str, payload: dict | None = None, method: str = "POST"):
    response = (httpx.get(f"{url}/{endpoint}", timeout=60) if method == "GET"
                else httpx.post(f"{url}/{endpoint}", json=payload or {}, timeout=60))
    response.raise_for_status()
    return verl_read_response(response)


class LongRollout:
    """A long greedy /generate on a thread (slime's payload); ``result`` is its parsed output."""

    def __init__(self, url: str):
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        params = slime_sampling_params(max_new_tokens=LONG, ignore_eos=True)
        self.result = slime_make_request(url, "generate", {"sampling_params": params, "return_logprob": True,
                                                           "input_ids": PROMPT})

    def join(self) -> dict:
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result


def long_tokens(engine: ReferenceEngine) -> int:
    """Tokens the LONG rollout has produced so far (0 before it runs)."""
    return max((len(r.output) for r in engine.scheduler.live() if r.request.sampling.max_new_tokens == LONG),
               default=0)


@contextlib.contextmanager
def parked_rollout(server, at: int = PARK_AT):
    """A LONG rollout with the engine's loop parked between two steps once it has produced ``at`` tokens: the
    control calls made inside find it provably live whatever the machine's speed (no timing involved), with
    no step in progress (flush, release and pause take the step lock as they do between any two steps). An
    abort made inside is marked at once and applied by the first step after ``park.go()``, which the test
    calls when it needs the loop to run (leaving the block does too)."""
    engine = server.engine
    with LoopPark(engine) as park:
        park.park_when(lambda: long_tokens(engine) >= at)
        rollout = LongRollout(server.url)
        park.wait_parked()
        assert num_requests(server.url) == 1 and long_tokens(engine) == at  # slime's own look at the load
        yield rollout, park


def num_requests(url: str) -> int:
    return slime_num_requests_from_load(httpx.get(f"{url}/v1/loads?include=core", timeout=10).json())


def health(url: str) -> tuple[int, dict]:
    r = httpx.get(f"{url}/health", timeout=10)
    return r.status_code, r.json()


def health_generate(url: str) -> int:
    """A held engine must answer well before SGLang's 20 s generation timeout: the client gives up at half."""
    return httpx.get(f"{url}/health_generate", timeout=HEALTH_CHECK_TIMEOUT_S / 2).status_code


# ----- slime --------------------------------------------------------------------------------------------
def test_slime_abort_until_idle(server):
    with parked_rollout(server) as (rollout, park):
        assert httpx.post(f"{server.url}/abort_request", json={"abort_all": True}, timeout=10).status_code == 200
        park.go()  # the loop applies the abort at its next step
        wait_until(lambda: num_requests(server.url) == 0, 10, "the server to be idle")
    out = rollout.join()
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) == PARK_AT < LONG


def test_slime_flush_cache_refused_while_running_then_clears_kv_and_landmarks(server):
    cache = server.engine.cache
    slime_flush_cache(server.url)  # from all zeros (unused pages of a new pool are uninitialised memory)
    slime_generate(server.url, slime_sampling_params(max_new_tokens=20))  # leaves K/V and landmarks in freed pages
    assert cache.k.abs().sum() > 0 and cache.landmarks.abs().sum() > 0
    with parked_rollout(server) as (rollout, park):
        r = httpx.get(f"{server.url}/flush_cache", timeout=10)
        assert r.status_code == 400 and "fail" in r.text.lower()  # SGLang's refusal while requests run
        httpx.post(f"{server.url}/abort_request", json={"abort_all": True}, timeout=10)
        park.go()
    assert rollout.join()["meta_info"]["finish_reason"]["type"] == "abort"
    slime_flush_cache(server.url)
    assert cache.k.abs().sum() == 0 and cache.v.abs().sum() == 0 and cache.landmarks.abs().sum() == 0
    assert httpx.post(f"{server.url}/flush_cache", timeout=10).status_code == 200  # POST as well


def test_slime_weight_sync_from_disk(server, ckpt):
    before, _, _, _ = slime_generate(server.url, slime_sampling_params())
    checksum = slime_make_request(server.url, "weights_checker", {"action": "checksum"})["per_engine_checksum"]
    slime_make_request(server.url, "weights_checker", {"action": "snapshot"})
    httpx.post(f"{server.url}/pause_generation", json={}, timeout=30).raise_for_status()
    slime_flush_cache(server.url)
    out = slime_make_request(server.url, "update_weights_from_disk", {"model_path": str(ckpt["b"]), "weight_version": "7"})
    assert out["success"] is True
    httpx.post(f"{server.url}/continue_generation", json={}, timeout=30).raise_for_status()
    # slime SGLangEngine.get_weight_version
    assert httpx.get(f"{server.url}/get_weight_version", timeout=10).json()["weight_version"] == "7"
    after, _, _, meta = slime_generate(server.url, slime_sampling_params())
    assert meta["weight_version"] == "7" and after != before
    assert slime_make_request(server.url, "weights_checker", {"action": "checksum"})["per_engine_checksum"] != checksum
    differ = httpx.post(f"{server.url}/weights_checker", json={"action": "compare"}, timeout=30)
    assert differ.status_code == 400 and "differ from the snapshot" in differ.json()["message"]
    slime_make_request(server.url, "update_weights_from_disk", {"model_path": str(ckpt["a"]), "weight_version": "8"})
    assert slime_generate(server.url, slime_sampling_params())[0] == before  # the old weights again
    assert slime_make_request(server.url, "weights_checker", {"action": "checksum"})["per_engine_checksum"] == checksum
    assert slime_make_request(server.url, "weights_checker", {"action": "compare"})["success"] is True


def test_slime_release_and_resume_memory(server):
    want, _, _, _ = slime_generate(server.url, slime_sampling_params())
    slime_flush_cache(server.url)
    slime_make_request(server.url, "release_memory_occupation")  # slime sends {} = every tag
    assert server.engine.cache.released and server.engine.cache.k.numel() == 0
    queued = {}
    thread = threading.Thread(target=lambda: queued.update(out=slime_generate(server.url, slime_sampling_params())),
                              daemon=True)
    thread.start()
    wait_until(lambda: num_requests(server.url) == 1, 10, "the request to queue")
    assert slime_num_requests_from_load(httpx.get(f"{server.url}/v1/loads?include=core").json()["loads"][0]) == 1
    for tags in (["weights"], ["kv_cache"]):  # slime resumes in two stages
        slime_make_request(server.url, "resume_memory_occupation", {"tags": tags})
    thread.join(30)
    assert not server.engine.cache.released and queued["out"][0] == want  # equals a run before the release


def test_slime_external_engine_discovery(server):
    """slime external.get_server_info + discover_external_engines + the sanity check of
    SGLangEngine._init_external (enable_memory_saver must equal args.offload_rollout=False)."""
    info = httpx.get(f"{server.url}/server_info", timeout=10).json()
    assert info == httpx.get(f"{server.url}/get_server_info", timeout=10).json()
    pp = int(info.get("pp_size") or info.get("pipeline_parallel_size") or 1)
    tp = int(info.get("tp_size") or info.get("tensor_parallel_size") or 1)
    assert (tp, pp, int(info.get("num_gpus") or tp * pp)) == (1, 1, 1)
    assert info.get("enable_memory_saver") is False and info["model_path"] == "tiny"
    assert info["page_size"] == 16 and info["context_length"] == 1024 and info["dp_size"] == 1
    assert httpx.get(f"{server.url}/health_generate", timeout=30).status_code == 200


def test_slime_eval_sampling_params(server):
    """slime's eval params: min_new_tokens and repetition_penalty, stop strings kept (no_stop_trim)."""
    tokens, logprobs, text, meta = slime_generate(server.url, slime_sampling_params(
        max_new_tokens=10, min_new_tokens=10, repetition_penalty=1.2, temperature=0.6, sampling_seed=1))
    assert len(tokens) == 10 == len(logprobs) and isinstance(text, str) and meta["finish_reason"]["type"] == "length"


def test_slime_distributed_update_routes_answer_with_reason(server):
    """slime's own payloads (``backend: "nccl"``, its default): the reference engine joins weight-update
    groups over gloo only and says so, naming the field (the gloo path itself, with a trainer process:
    tests/e2e/test_weights_distributed.py); tensors passed by CUDA IPC are refused with the reason."""
    served = server.engine.weight_version
    for endpoint, payload, field, words in (
        ("init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                       "world_size": 2, "group_name": "g", "backend": "nccl"}, "backend", "gloo"),
        ("update_weights_from_distributed", {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[1]],
                                             "group_name": "g", "flush_cache": False}, "names[0]", "not a parameter"),
        ("destroy_weights_update_group", {"group_name": "g"}, "group_name", "does not exist"),
        ("update_weights_from_tensor", {"serialized_named_tensors": ["AAAA"], "load_format": None, "flush_cache": False},
         None, "unpickling bytes from HTTP is unsafe"),
    ):
        r = httpx.post(f"{server.url}/{endpoint}", json=payload, timeout=10)
        assert r.status_code == 400, endpoint
        body = r.json()
        assert body["success"] is False and words in body["message"], (endpoint, body["message"])
        assert body["error"].get("field") == field, endpoint
    assert server.engine.weight_version == served


# ----- verl ---------------------------------------------------------------------------------------------
def test_verl_http_adapter_sequence(server):
    url = server.url
    assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200  # launch_server_process
    flushed = verl_read_response(httpx.get(f"{url}/flush_cache", timeout=10))
    assert flushed["text"].startswith("Cache flushed") and flushed["content_type"].startswith("text/plain")
    payload = {"text": None, "sampling_params": {"max_new_tokens": 5, "temperature": 0}, "input_ids": PROMPT,
               "image_data": None, "return_logprob": True, "logprob_start_len": None, "top_logprobs_num": None,
               "token_ids_logprob": None, "lora_path": None, "custom_logit_processor": None}
    out = verl_request(url, "generate", {k: v for k, v in payload.items() if v is not None})
    assert len(out["output_ids"]) == 5 and [t for _, t, _ in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
    with parked_rollout(server) as (rollout, park):
        verl_request(url, "abort_request", {"rid": "", "abort_all": True})
        park.go()
    out_long = rollout.join()
    assert out_long["meta_info"]["finish_reason"]["type"] == "abort" and len(out_long["output_ids"]) == PARK_AT
    verl_request(url, "release_memory_occupation", {"tags": ["kv_cache"]})
    verl_request(url, "resume_memory_occupation", {"tags": None})
    assert verl_request(url, "generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5,
                                                                                   "temperature": 0}})["output_ids"] \
        == out["output_ids"]


def test_abort_by_rid_and_sglang_default_rid(server):
    with parked_rollout(server) as (rollout, park):
        assert httpx.post(f"{server.url}/abort_request", json={}, timeout=10).json()["num_aborted"] == 0  # rid "" = none
        (rid,) = server.engine.live_requests()
        assert httpx.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=10).json()["num_aborted"] == 1
        park.go()
    out = rollout.join()
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) == PARK_AT


# ----- SGLang's frontend ----------------------------------------------------------------------------------
def test_sglang_frontend_gen_payload(server):
    """RuntimeEndpoint.generate: global skip/spaces flags, then SglSamplingParams.to_srt_kwargs()."""
    data = {"text": "sparrow", "sampling_params": {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 6, "min_new_tokens": 0,
        "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0.0, "top_p": 1.0, "top_k": -1,
        "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False, "regex": None,
        "json_schema": None}, "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    res = httpx.post(f"{server.url}/generate", json=data, timeout=60)
    res.raise_for_status()
    obj = res.json()
    comp, meta_info = obj["text"], obj["meta_info"]
    assert isinstance(comp, str) and meta_info["completion_tokens"] == 6
    assert all(isinstance(t, str) for _, _, t in meta_info["output_token_logprobs"])


def test_flush_timeout_waits_for_idle_and_release_needs_idle(server, monkeypatch):
    """SGLang 0.5.17: ``/flush_cache?timeout=s`` waits up to s for the server to become idle;
    ``release_memory_occupation`` needs an idle server."""
    memory, refusals = server.engine.memory, []
    flush = memory.flush_cache

    def counted() -> bool:
        done = flush()
        refusals.extend([] if done else [1])
        return done

    monkeypatch.setattr(memory, "flush_cache", counted)  # to see the waiting flush refused while the rollout runs
    with ThreadPoolExecutor(1) as pool, parked_rollout(server) as (rollout, park):
        r = httpx.post(f"{server.url}/release_memory_occupation", json={"tags": ["kv_cache"]}, timeout=10)
        assert r.status_code == 400 and r.json()["success"] is False and not server.engine.cache.released
        assert httpx.get(f"{server.url}/flush_cache?timeout=0.2", timeout=10).status_code == 400  # still running
        before = len(refusals)
        flushing = pool.submit(lambda: httpx.get(f"{server.url}/flush_cache?timeout=30", timeout=60).status_code)
        wait_until(lambda: len(refusals) > before, 30, "the flush to find the rollout running")
        assert not flushing.done()  # waiting: the rollout is live (parked) and 30 s are far off
        httpx.post(f"{server.url}/abort_request", json={"abort_all": True}, timeout=10)
        park.go()  # the abort lands at the loop's next step; the server becomes idle
        assert flushing.result(60) == 200  # waited for the abort
    assert rollout.join()["meta_info"]["finish_reason"]["type"] == "abort"
    assert httpx.get(f"{server.url}/flush_cache?timeout=-1", timeout=10).status_code == 422


# ----- health while nothing can run (a router or trainer polling it must not send traffic into a stall) ------
def test_health_reports_released_kv_cache_until_resumed(server):
    want, _, _, _ = slime_generate(server.url, slime_sampling_params())
    assert health_generate(server.url) == 200
    slime_make_request(server.url, "release_memory_occupation", {"tags": ["kv_cache"]})
    queued = {}
    thread = threading.Thread(target=lambda: queued.update(out=slime_generate(server.url, slime_sampling_params())),
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: num_requests(server.url) == 1, 10, "the request to queue")
        status, body = health(server.url)
        assert status == 503 and body["status"] == "memory_released" and "resume_memory_occupation" in body["detail"]
        assert body["free_pages"] == 0 and body["total_pages"] > 0 and body["queued_requests"] == 1
        assert health_generate(server.url) == 503  # at once: no token can come
        load = httpx.get(f"{server.url}/v1/loads?include=core", timeout=10).json()["loads"][0]
        assert load["num_used_tokens"] == 0 and load["num_waiting_reqs"] == 1
        assert "out" not in queued and server.engine.live_requests()  # it made no progress
    finally:
        slime_make_request(server.url, "resume_memory_occupation", {"tags": ["kv_cache"]})
    thread.join(30)
    assert queued["out"][0] == want
    assert health_generate(server.url) == 200
    status, body = health(server.url)
    assert status == 200 and body["status"] == "ok" and body["free_pages"] == body["total_pages"] > 0


def test_health_reports_paused_generation_until_continued(server, monkeypatch):
    engine, looks = server.engine, []
    look = engine.health

    def counted():
        looks.append(1)
        return look()

    monkeypatch.setattr(engine, "health", counted)  # to see /health_generate waiting for the busy engine's step
    with ThreadPoolExecutor(1) as pool, parked_rollout(server) as (rollout, park):
        before = len(looks)
        probing = pool.submit(health_generate, server.url)
        # its first look and two polls of the step counter: parked, no step comes, and it is waiting for one
        wait_until(lambda: len(looks) >= before + 3, 30, "/health_generate to wait for a step")
        assert not probing.done()  # (SGLang's 20 s are far off)
        park.park_when(lambda: long_tokens(engine) >= PARK_AT + 2)  # two steps more, then parked again
        park.wait_parked()
        assert probing.result(30) == 200  # busy: the engine finished a step
        assert long_tokens(engine) == PARK_AT + 2 and num_requests(server.url) == 1
        slime_make_request(server.url, "pause_generation", {"mode": "in_place"})
        try:
            status, body = health(server.url)
            assert status == 503 and body["status"] == "paused" and "continue_generation" in body["detail"]
            assert health_generate(server.url) == 503  # a live request that cannot move does not make it healthy
        finally:
            slime_make_request(server.url, "continue_generation")
            park.go()
    assert health_generate(server.url) == 200 and health(server.url)[1]["status"] == "ok"
    out = rollout.join()
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == LONG


def test_health_generate_answers_503_while_paused_idle(server):
    slime_make_request(server.url, "pause_generation", {"mode": "abort"})
    try:
        assert health_generate(server.url) == 503 and health(server.url)[0] == 503
        assert not server.engine.live_requests()  # no health-check request left queued behind the pause
    finally:
        slime_make_request(server.url, "continue_generation")
    assert health_generate(server.url) == 200
