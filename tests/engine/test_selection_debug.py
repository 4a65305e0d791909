"""The sparrow backend's selection debug hook (pure parts): FlashInfer page ids map back to the
logical pages ``select_pages`` chose, records round-trip through the flushed files, and the hook
is off unless its environment variable is set."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparrow_server.kernels import reference as R
from sparrow_server.sglang_plugin.scheduler import selection_debug as D
from sparrow_server.sglang_plugin.scheduler.planning import REQUEST_FIELDS, logical_page_lists, plan_step
from test_plugin_planning import PS, _fixed, _pool


def _selected(seed: int, lengths=None, h: int = 3, g: int = 3, d: int = 8):
    """A step of 5 requests through the GPU kernels' references: (plan, ids, req_to_token, rows, lengths, pages)."""
    rng = np.random.default_rng(seed)
    lengths = np.array(lengths if lengths is not None else [int(x) for x in rng.integers(40, 700, size=5)])
    k_buf, r2t, _ = _pool(lengths.tolist(), h, d, seed)
    q = torch.randn(5, h * g, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    plan = plan_step([_fixed(int(b)) for b in rng.integers(4, 12, size=5)], lengths, np.zeros(5), h, PS, 64)
    lm = torch.zeros(k_buf.shape[0] // PS, h, d, dtype=torch.float64)
    R.update_landmarks(k_buf, torch.arange(k_buf.shape[0]), lm, PS, only_full=False)
    rows = torch.arange(1, 6)
    fields = {f: torch.from_numpy(getattr(plan, f)) for f in REQUEST_FIELDS}
    pcap = max(math.ceil(n / PS) for n in lengths)
    scores = R.page_scores(q, lm, r2t, rows, fields["cand_lo"], fields["cand_hi"], PS, pcap)
    top = torch.sort(scores, dim=1, descending=True, stable=True).indices
    ids = torch.full((plan.total_pages,), -1, dtype=torch.int64)
    R.write_indices(top, r2t, rows, fields, torch.from_numpy(plan.row_indptr), h, PS, ids)
    return plan, ids, r2t, rows.numpy(), lengths, logical_page_lists(plan, top.numpy())


@pytest.mark.parametrize("seed", range(3))
def test_page_ids_map_back_to_the_selected_logical_pages(seed):
    plan, ids, r2t, rows, lengths, want = _selected(seed)
    h = plan.num_kv_heads
    for r, pages in enumerate(want):
        b = r // h
        first = r2t[rows[b], : math.ceil(lengths[b] / PS) * PS : PS].numpy()
        head, got = D.logical_pages(ids[plan.row_indptr[r]:plan.row_indptr[r + 1]].numpy(), first, h)
        assert head == r % h and got.tolist() == sorted(pages)
    with pytest.raises(ValueError, match="not a page of this request"):
        D.logical_pages(np.array([10**6 * h]), first, h)
    with pytest.raises(ValueError, match="mixes KV heads"):
        D.logical_pages(np.array([int(first[0]) * h, int(first[1]) * h + 1]), first, h)


def test_recorder_keeps_the_wanted_steps_and_round_trips(tmp_path):
    plan, ids, r2t, rows, lengths, want = _selected(7, lengths=[130, 192, 300, 448, 77])
    h = plan.num_kv_heads
    rec = D.SelectionRecorder(tmp_path, 64, PS, h)
    np.testing.assert_array_equal(rec.wanted(lengths, rows), [1, 3])
    np.testing.assert_array_equal(rec.wanted(lengths, np.array([1, 0, 3, 4, 5])), [3])  # row 0: padding
    rec.record(5, rows, lengths, np.arange(5) + 100, plan.row_indptr, ids, r2t, real_bs=5)
    rec.record(6, rows, lengths, np.arange(5) + 100, plan.row_indptr, ids, r2t, real_bs=3)  # request 3 is padding
    assert rec.flush() is not None and rec.flush() is None
    got = D.load_records(tmp_path)
    assert got["layer"].tolist() == [5] * 2 * h + [6] * h
    assert got["prompt_len"].tolist() == [101] * h + [103] * h + [101] * h
    assert got["length"].tolist() == [192] * h + [448] * h + [192] * h
    assert got["head"].tolist() == list(range(h)) * 3
    for i, (b, head) in enumerate([(b, x) for b in (1, 3, 1) for x in range(h)]):
        assert got["pages"][i].tolist() == sorted(want[b * h + head])


def test_the_hook_is_off_unless_asked_and_validates_its_settings(tmp_path):
    assert D.recorder_from_env(PS, 3, environ={}) is None
    rec = D.recorder_from_env(PS, 3, environ={D.ENV_DIR: str(tmp_path / "sel"), D.ENV_EVERY: "32"})
    assert rec.every == 32 and (tmp_path / "sel").is_dir()
    for bad in ("0", "x"):
        with pytest.raises(ValueError, match=D.ENV_EVERY):
            D.recorder_from_env(PS, 3, environ={D.ENV_DIR: str(tmp_path), D.ENV_EVERY: bad})
