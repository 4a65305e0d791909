"""Teacher-forced sparse attention equals step-by-step sparse decode at every generated position."""
import torch

from sparrow_server.sparsity.selection import dense_decode_attention, sparse_decode_attention
from sparrow_server.sparsity.teacher_forced import sparse_causal_attention

PS, SINK, RECENT = 4, 1, 2


def _inputs(t_len=70, hq=6, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t_len, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(t_len, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(t_len, hkv, d, generator=g, dtype=torch.float64)
    return q, k, v


def test_matches_decode_step_by_step():
    q, k, v = _inputs()
    t_len, sparse_from = q.shape[0], 9
    budget = torch.full((t_len,), 5)
    out = sparse_causal_attention(q, k, v, budget, sparse_from, PS, SINK, RECENT, 0.35, chunk=16)
    for t in range(t_len):
        lengths = torch.tensor([t + 1])
        if t < sparse_from:
            ref = dense_decode_attention(q[t : t + 1], k[None, : t + 1], v[None, : t + 1], lengths, 0.35)
        else:
            ref, _ = sparse_decode_attention(
                q[t : t + 1], k[None, : t + 1], v[None, : t + 1], lengths, budget[t : t + 1], PS, SINK, RECENT, 0.35
            )
        torch.testing.assert_close(out[t], ref[0], rtol=0, atol=1e-12)


def test_sparsity_changes_the_output_when_budget_is_tight():
    q, k, v = _inputs(seed=1)
    tight = sparse_causal_attention(q, k, v, torch.full((q.shape[0],), 4), 0, PS, SINK, RECENT, 0.35)
    full = sparse_causal_attention(q, k, v, torch.full((q.shape[0],), 10**6), 0, PS, SINK, RECENT, 0.35)
    assert (tight - full).abs().max() > 1e-3
    # with the full budget every position is exactly causal dense attention
    dense = torch.stack([
        dense_decode_attention(q[t : t + 1], k[None, : t + 1], v[None, : t + 1], torch.tensor([t + 1]), 0.35)[0]
        for t in range(q.shape[0])
    ])
    torch.testing.assert_close(full, dense, rtol=0, atol=1e-12)


def test_landmark_dtype_rounds_the_landmarks_before_scoring():
    """Stored in bfloat16 (a server's default SPARROW_LANDMARK_DTYPE), two pages whose float32 landmarks differ by
    less than bfloat16's step score alike, and the tie goes to the earlier page; float32 picks the larger one."""
    from sparrow_server.sparsity.teacher_forced import causal_page_selection

    # 6 pages of 4 tokens: sink page 0, candidates 1-3, recent pages 4-5; a budget of 4 keeps one candidate.
    k = torch.zeros(24, 1, 2, dtype=torch.float64)
    k[4:8, 0, 0] = 1.0            # page 1
    k[8:12, 0, 0] = 1.0 + 2**-12  # page 2: above page 1 in float32, equal in bfloat16 (step 2^-7 at 1)
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)  # the query of position 23
    budget = torch.tensor([4])
    chosen = {dtype: causal_page_selection(q, k, budget, PS, SINK, RECENT, 23, dtype)[0, 0].tolist()
              for dtype in (torch.float32, torch.bfloat16)}
    assert chosen == {torch.float32: [0, 2, 4, 5], torch.bfloat16: [0, 1, 4, 5]}


def test_float8_landmarks_keep_small_keys_apart():
    """Stored in float8 (SPARROW_LANDMARK_DTYPE=float8_e4m3fn), each page's landmark carries a power-of-two scale:
    keys of a dummy-weight model's magnitude (1e-3, e4m3's smallest step unscaled is 2^-9) still rank their pages:
    the larger of two pages one float8 step apart wins; cast unscaled, both round to 2^-9 and would tie."""
    from sparrow_server.sparsity.teacher_forced import causal_page_selection

    k = torch.zeros(24, 1, 2, dtype=torch.float64)
    k[4:8, 0, 0] = 1e-3                 # page 1
    k[8:12, 0, 0] = 1e-3 * (1 + 2**-3)  # page 2: one float8 step above page 1 (step 2^-3 of the value)
    k[4:12, 0, 1] = 1e-3                # a second element: each page's scale set by its largest element
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    chosen = causal_page_selection(q, k, torch.tensor([4]), PS, SINK, RECENT, 23, torch.float8_e4m3fn)
    assert chosen[0, 0].tolist() == [0, 2, 4, 5]
    unscaled = k.to(torch.float8_e4m3fn)  # both pages' keys round to e4m3's smallest step, 2^-9: a tie
    assert torch.equal(unscaled[4:8], unscaled[8:12]) and float(unscaled[4, 0, 0]) == 2.0**-9


def test_float8_landmarks_are_stored_scaled():
    """``store_landmarks``: each landmark's largest element stored in [2^7, 2^8] (rounded; e4m3's largest is 448),
    its power-of-two scale beside it, the values back within float8's step (1/16 of the largest element, relative
    1/16 above 2^-6 of it); other dtypes a plain cast with no scale."""
    from sparrow_server.kernels.reference import landmark_values, store_landmarks

    means = torch.randn(6, 4, 64) * torch.tensor([1e-3, 1.0, 300.0, 1e-6, 0.0, 5e4])[:, None, None]
    stored, scales = store_landmarks(means, torch.float8_e4m3fn)
    top = stored.float().abs().amax(dim=-1)
    assert ((top >= 128) & (top <= 256))[:4].all() and ((top >= 128) & (top <= 256))[5].all() and (top[4] == 0).all()
    assert torch.equal(torch.frexp(scales[scales > 0])[0], torch.full_like(scales[scales > 0], 0.5))  # powers of two
    err = (landmark_values(stored, scales) - means).abs()
    assert (err <= means.abs().amax(dim=-1, keepdim=True) / 16).all()
    plain, no_scales = store_landmarks(means, torch.bfloat16)
    assert no_scales is None and torch.equal(plain, means.to(torch.bfloat16))
