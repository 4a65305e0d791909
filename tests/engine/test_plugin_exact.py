"""Exact acceptance on kept positions in the plug-in's scheduler hooks (issue 25), on stand-ins for
SGLang's batch objects (CPU): rows stored only at kept positions, freed by the verify pass or an abort,
and the verify pass's values equal to float64 exact acceptance of the same rows, which an off-by-one
position or rows kept as raw bfloat16 logits would miss; beside each value, the top-20 lower bound of the
same two rows (at a dense step, of the dense row with itself)."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from sparrow_server.sglang_plugin.scheduler import exact_hooks, exact_verify, state
from sparrow_server.stats import exact_wire
from sparrow_server.stats.acceptance import exact_acceptance, logits_to_topk, topk_acceptance_lower_bound
from sparrow_server.stats.exact_subsample import KeptPositions

H, V, P, N = 16, 512, 5, 40
KEPT = KeptPositions(offset=3, stride=8)  # generated positions 3, 11, 19, 27, 35
TOL = 2e-3


class Mode:
    def __init__(self, kind):
        self.kind = kind

    def is_decode(self):
        return self.kind == "decode"

    def is_extend(self):
        return self.kind == "extend"


def _req(rid, custom_params=None, prompt_len=P):
    return types.SimpleNamespace(rid=rid, origin_input_ids=list(range(prompt_len)), customized_info=None,
                                 sampling_params=types.SimpleNamespace(custom_params=custom_params))


def _decode(reqs, seq_lens):
    batch = types.SimpleNamespace(reqs=reqs, forward_mode=Mode("decode"), seq_lens_cpu=torch.tensor(seq_lens))
    fb = types.SimpleNamespace(forward_mode=Mode("decode"), seq_lens_cpu=torch.tensor(seq_lens))
    exact_hooks.after_init_new(fb, batch)
    return fb


def _extend(reqs, prefix, extend):
    batch = types.SimpleNamespace(reqs=reqs, forward_mode=Mode("extend"))
    fb = types.SimpleNamespace(forward_mode=Mode("extend"), extend_prefix_lens_cpu=list(prefix),
                               extend_seq_lens_cpu=list(extend))
    exact_hooks.after_init_new(fb, batch)
    return fb


def _sample(fb, logits):
    exact_hooks.before_sample(object(), types.SimpleNamespace(next_token_logits=logits), fb)


class Processor:
    """The LogitsProcessor's LM head: bfloat16 matmul, then float32 (as SGLang's ``_get_logits``)."""

    def _get_logits(self, hidden, lm_head, meta, use_logits_buffer=True):
        return (hidden.to(torch.bfloat16) @ lm_head.to(torch.bfloat16)).float()


@pytest.fixture
def world(monkeypatch):
    state.reset()
    monkeypatch.setattr(exact_hooks, "_logits_metadata", lambda m: m)  # no SGLang: the processor ignores it
    monkeypatch.setattr(exact_hooks, "_pending", None)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(H, V, generator=g) * 2
    dense_hidden = torch.randn(P + N, H, generator=g)  # input position -> dense final hidden state
    sparse_logits = (dense_hidden[P - 1:P + N - 1] @ w) + 0.7 * torch.randn(N, V, generator=g) + 30  # g -> row
    yield types.SimpleNamespace(w=w, dense_hidden=dense_hidden, sparse=sparse_logits)
    state.reset()


def _rollout(world, rid="r1", kept=KEPT, lora_id=None):
    """Prefill then decode positions 1..N-1 of ``rid`` (with SGLang's ``lora_id``) beside a request that keeps nothing."""
    other, req = _req("other"), _req(rid, exact_wire.encode_keep(kept))
    req.lora_id = lora_id
    fb = _extend([other, req], [0, 0], [P, P])
    _sample(fb, torch.stack([torch.zeros(V), world.sparse[0]]))
    for g in range(1, N):
        fb = _decode([other, req], [P + g, P + g])
        _sample(fb, torch.stack([torch.zeros(V), world.sparse[g]]))
    return req


def _verify(world, rid="r1", kept=KEPT, chunks=((0, 20), (20, P + N - 20)), k=exact_wire.BOUND_TOPK):
    """The dense verify prefill in chunks, after a 3-token request in the same batch (``k``: the bound's lists)."""
    verify = _req("v-" + rid, exact_wire.encode_verify(exact_wire.ExactVerify(rid, P, N, kept, k)))
    other = _req("x", prompt_len=3)
    proc = Processor()
    for prefix, extend in chunks:
        fb = _extend([other, verify], [0, prefix], [3, extend])
        hidden = torch.cat([torch.zeros(3, H), world.dense_hidden[prefix:prefix + extend]])

        def original(processor, *args, **kwargs):
            return "out"

        assert exact_hooks.around_logits_forward(original, proc, None, hidden, world.w, fb) == "out"
    return verify


def _truth(world, positions):
    dense = (world.dense_hidden[P - 1:P + N - 1].to(torch.bfloat16) @ world.w.to(torch.bfloat16)).double()
    return exact_acceptance(world.sparse.double()[positions], dense[positions]).numpy()


def _dense_rows(world, positions):
    return (world.dense_hidden[P - 1:P + N - 1].to(torch.bfloat16) @ world.w.to(torch.bfloat16)).double()[positions]


def _truth_bound(sparse_rows, dense_rows, k=exact_wire.BOUND_TOPK):
    return topk_acceptance_lower_bound(*logits_to_topk(sparse_rows.double(), k), *logits_to_topk(dense_rows, k)).numpy()


def _payload(req):
    info = req.customized_info or {}
    (payload,) = info[exact_wire.RESULT_KEY]
    return payload


def _check(world, payload):
    expected = KEPT.positions(N).tolist()
    assert payload["positions"] == expected and payload["missing"] == []
    assert np.abs(np.array(payload["acceptance"]) - _truth(world, expected)).max() < TOL
    bound = np.array(payload["bound"])
    assert np.abs(bound - _truth_bound(world.sparse[expected], _dense_rows(world, expected))).max() < TOL
    assert (bound <= np.array(payload["acceptance"]) + TOL).all()
    assert (np.array(payload["acceptance"]) - bound).max() > 2 * TOL  # reporting the value as its bound would fail above


def test_rows_are_stored_only_at_kept_positions_and_freed_by_the_verify_pass(world):
    req = _rollout(world)
    store = state.exact_store()
    entry = store.entry("r1")
    assert sorted(entry.rows) == KEPT.positions(N).tolist() and store.entry("other") is None
    assert all(r.dtype == torch.float16 and r.shape == (V,) and float(r.max()) == 0 for r in entry.rows.values())
    assert store.bytes == len(entry.rows) * V * 2
    assert req.customized_info is None
    verify = _verify(world)
    _check(world, _payload(verify))
    assert store.entry("r1") is None and store.bytes == 0 and len(store) == 0


def test_the_verify_pass_in_one_chunk_gives_the_same_values(world):
    _rollout(world)
    _check(world, _payload(_verify(world, chunks=((0, P + N),))))


def test_an_off_by_one_row_position_would_fail_the_check(world, monkeypatch):
    _rollout(world)
    monkeypatch.setattr(exact_wire.ExactVerify, "row_position", lambda self, g: self.prompt_len + g)
    with pytest.raises(AssertionError):
        _check(world, _payload(_verify(world)))


def test_rows_kept_as_raw_bfloat16_logits_would_fail_the_check(world, monkeypatch):
    monkeypatch.setattr(exact_hooks, "compact_logits", lambda row: row.to(torch.bfloat16))
    monkeypatch.setattr(exact_verify, "kept_acceptance", lambda s, d: exact_acceptance(s.float(), d.float()))
    _rollout(world)
    with pytest.raises(AssertionError):
        _check(world, _payload(_verify(world)))


def test_a_request_without_kept_positions_stores_nothing(world):
    req = _req("plain")
    for g in range(1, 10):
        fb = _decode([req], [P + g])
        assert getattr(fb, exact_hooks.CAPTURES_ATTR) == []
        _sample(fb, torch.randn(1, V))
    assert len(state.exact_store()) == 0


def test_an_abort_frees_the_rows(world):
    _rollout(world, rid="abc-0")
    exact_hooks.after_abort(None, object(), types.SimpleNamespace(rid="abc", abort_all=False))
    assert len(state.exact_store()) == 0 and state.exact_store().bytes == 0


def test_a_re_prefilled_position_is_reported_missing_not_filled_with_a_dense_row(world):
    """A retracted request is re-prefilled (prompt + its tokens so far) through the dense extend path:
    the row it gives for the next position is not sparse decode's, so that position is invalid; an
    earlier chunk of the re-prefill leaves the rows already kept alone."""
    other, req = _req("other"), _req("r1", exact_wire.encode_keep(KEPT))
    fb = _extend([req], [0], [P])
    _sample(fb, world.sparse[:1])
    for g in range(1, 11):
        _sample(_decode([other, req], [P + g, P + g]), torch.stack([torch.zeros(V), world.sparse[g]]))
    _sample(_extend([req], [0], [P + 3]), world.sparse[3:4] * 0)  # a middle chunk ending at position 3
    _sample(_extend([req], [P + 3], [8]), world.sparse[11:12] * 0)  # the last chunk: position 11, dense
    for g in range(12, N):
        _sample(_decode([req], [P + g]), world.sparse[g:g + 1])
    payload = _payload(_verify(world))
    assert payload["missing"] == [11]
    assert payload["positions"] == [3, 19, 27, 35]
    assert np.abs(np.array(payload["acceptance"]) - _truth(world, [3, 19, 27, 35])).max() < TOL


def test_a_full_store_refuses_rows_and_reports_them_missing(world, monkeypatch):
    state.exact_store().max_bytes = 2 * V * 2  # two rows
    _rollout(world)
    assert state.exact_store().refused_rows == 3
    payload = _payload(_verify(world))
    assert payload["positions"] == [3, 11] and payload["missing"] == [19, 27, 35]


def test_a_verify_request_for_rows_never_stored_reports_every_position_missing(world):
    payload = _payload(_verify(world, rid="never"))
    assert payload["positions"] == [] and payload["missing"] == KEPT.positions(N).tolist()


def test_a_replay_batch_object_without_the_jobs_uses_the_pending_extend(world):
    """A prefill graph's body-capture replay hands the logits processor a batch object of its own."""
    _rollout(world)
    verify = _req("v", exact_wire.encode_verify(exact_wire.ExactVerify("r1", P, N, KEPT)))
    _extend([verify], [0], [P + N])
    replay = types.SimpleNamespace(forward_mode=Mode("extend"), extend_seq_lens_cpu=[P + N])
    exact_hooks.around_logits_forward(lambda *a, **k: None, Processor(), None, world.dense_hidden, world.w, replay)
    _check(world, _payload(verify))
    other = types.SimpleNamespace(forward_mode=Mode("extend"), extend_seq_lens_cpu=[7])  # lengths differ: not used
    assert exact_hooks._jobs_for(other) == []


def test_a_bad_parameter_is_ignored_with_a_warning(world, caplog):
    req = _req("bad", {exact_wire.KEEP_PARAM: {"offset": 0, "stride": 0}})
    fb = _decode([req], [P + 1])
    assert getattr(fb, exact_hooks.CAPTURES_ATTR) == [] and "stride" in caplog.text


def test_a_step_is_dense_exactly_where_the_backend_attends_every_page():
    """``attends_every_page`` agrees with the backend's plan (``plan_request``: count == pages) at every
    length around a budget's edge, for a fixed budget, a per-bin preset and the dense schedule."""
    from sparrow_server.sglang_plugin.scheduler.planning import plan_request
    from sparrow_server.sparsity.registry import ScheduleRegistry
    from sparrow_server.sparsity.schedule import Schedule, dense_schedule

    state.reset()
    try:
        table = state.table(8)
        fixed = Schedule(name="fixed-256", budgets_tokens=(256,), bin_tokens=10**9)
        cases = {1: (fixed, 100), 2: (ScheduleRegistry().get("qwen3-1.7b-0.86"), 1000), 3: (dense_schedule(), 50)}
        for row, (schedule, prompt) in cases.items():
            table.assign(row, schedule, prompt)
            req = types.SimpleNamespace(req_pool_idx=row)
            for length in [*range(200, 300), *range(2000, 2100, 7), 40000]:
                n, count, *_ = plan_request(schedule, length, prompt, 16, 10**6)
                assert exact_hooks.attends_every_page(req, length) == (count == n), (schedule.name, length)
        req = types.SimpleNamespace(req_pool_idx=1)
        assert exact_hooks.attends_every_page(req, 256) and not exact_hooks.attends_every_page(req, 257)
        assert not exact_hooks.attends_every_page(types.SimpleNamespace(), 10)  # no row: measured
    finally:
        state.reset()
    assert not exact_hooks.attends_every_page(types.SimpleNamespace(req_pool_idx=1), 10)  # no table: measured


def test_a_dense_step_scores_one_and_keeps_no_row(world, monkeypatch):
    """Kept positions whose step attended every page (here: positions below 20) are 1 by construction,
    without a stored row or a dense comparison; the others are measured as before. The prefill's
    position 0 is such a step."""
    monkeypatch.setattr(exact_hooks, "attends_every_page", lambda req, length: length - P < 20)
    kept = KeptPositions(offset=0, stride=8)  # 0, 8, 16, 24, 32
    _rollout(world, kept=kept)
    entry = state.exact_store().entry("r1")
    assert sorted(entry.rows) == [24, 32] and entry.scores == {0: 1.0, 8: 1.0, 16: 1.0}
    payload = _payload(_verify(world, kept=kept, k=2))  # top-2 lists: their mass is well below 1 on these rows
    assert payload["positions"] == [0, 8, 16, 24, 32] and payload["missing"] == []
    assert payload["acceptance"][:3] == [1.0, 1.0, 1.0]
    assert np.abs(np.array(payload["acceptance"][3:]) - _truth(world, [24, 32])).max() < TOL
    assert min(_truth(world, [0, 8, 16])) < 0.99  # measuring those rows would have given other values
    dense = _dense_rows(world, [0, 8, 16])  # a dense step's two lists are the dense row's: the bound is its top-20 mass
    assert np.abs(np.array(payload["bound"][:3]) - _truth_bound(dense, dense, k=2)).max() < TOL
    assert min(payload["bound"][:3]) < 1 - 10 * TOL  # not the value (1): the check above has teeth


def test_a_step_past_the_last_token_stays_out_of_the_payload(world, monkeypatch):
    """SGLang's overlap scheduler runs one decode step past a finished request's last token (its output
    discarded). Kept and dense there (position N = 40 with stride 8), it must not reach the payload: the
    GPU service test's dense rollout got positions [96] back and fell back to the top-k bound."""
    monkeypatch.setattr(exact_hooks, "attends_every_page", lambda req, length: True)
    kept = KeptPositions(offset=0, stride=8)
    req = _rollout(world, kept=kept)
    fb = _decode([req], [P + N])
    _sample(fb, world.sparse[N - 1:N])
    assert N in state.exact_store().entry("r1").scores
    payload = _payload(_verify(world, kept=kept))
    assert payload["positions"] == [0, 8, 16, 24, 32] and payload["acceptance"] == [1.0] * 5
    assert payload["missing"] == []


def test_a_dense_step_under_an_adapter_is_measured(world, monkeypatch):
    """With an adapter the rollout sampled from base + adapter while the dense verify runs the base model:
    a step that attended every page (the prefill's position 0 too) is measured like any other (the GPU
    service test's dense schedule with ``distill-v2`` read 1.0 when it was scored 1)."""
    monkeypatch.setattr(exact_hooks, "attends_every_page", lambda req, length: True)
    kept = KeptPositions(offset=0, stride=8)
    _rollout(world, kept=kept, lora_id="distill-v2")
    entry = state.exact_store().entry("r1")
    assert sorted(entry.rows) == [0, 8, 16, 24, 32] and entry.scores == {}
    payload = _payload(_verify(world, kept=kept, k=2))  # top-2 lists: their mass is well below 1 on these rows
    assert payload["positions"] == [0, 8, 16, 24, 32] and payload["missing"] == []
    assert np.abs(np.array(payload["acceptance"]) - _truth(world, [0, 8, 16, 24, 32])).max() < TOL
