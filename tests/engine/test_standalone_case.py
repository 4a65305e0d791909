"""``standalone_layer.make_case``'s page placement (the kernel bench's ``--placement``), on CPU."""
from __future__ import annotations

import pytest
import torch

from sparrow_server.sglang_plugin.scheduler.standalone_layer import make_case


def _pages(case, page_size=16):
    """Each request's physical pages in logical order."""
    return [(case.req_to_token[1 + i, :int(n)][::page_size] // page_size).tolist() for i, n in enumerate(case.lengths)]


def test_contiguous_placement_lays_each_request_in_order_back_to_back_random_shuffles():
    lengths = [64, 40, 100]  # 4, 3, 7 pages
    contiguous = make_case(lengths, num_kv_heads=2, head_dim=8, device="cpu", placement="contiguous")
    shuffled = make_case(lengths, num_kv_heads=2, head_dim=8, device="cpu")
    assert _pages(contiguous) == [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    pages = _pages(shuffled)
    assert sorted(p for r in pages for p in r) == list(range(1, 15)) and pages != _pages(contiguous)
    # the same keys, values and queries either way: one A/B changes where the pages lie, nothing else
    assert torch.equal(contiguous.q, shuffled.q) and torch.equal(contiguous.k_buf, shuffled.k_buf)
    with pytest.raises(ValueError, match="placement='packed'"):
        make_case(lengths, device="cpu", placement="packed")


def test_interleaved_placement_lays_page_j_of_every_request_before_page_j_plus_1():
    lengths = [64, 40, 100]  # 4, 3, 7 pages: the short requests drop out of the turn as they end
    interleaved = make_case(lengths, num_kv_heads=2, head_dim=8, device="cpu", placement="interleaved")
    assert _pages(interleaved) == [[1, 4, 7, 10], [2, 5, 8], [3, 6, 9, 11, 12, 13, 14]]
    assert torch.equal(interleaved.k_buf, make_case(lengths, num_kv_heads=2, head_dim=8, device="cpu").k_buf)
