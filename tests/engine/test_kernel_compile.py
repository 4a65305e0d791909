"""The fused selection kernel compiled for an H100/H200 (sm_90) on CPU, as Triton's launcher specializes a
server's arguments: the interpreter (``sparse_kernel_cases.py``) runs Python, not the compiler, so only this
sees what the GPU build does (a non-constexpr global, say, compiles nowhere but interprets fine), and what the
variant's design rests on: two row programs share an SM, by registers and by shared memory."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SM_REGISTERS, SM_SHARED_BYTES = 65536, 228 * 1024  # an H100 / H200 SM (sm_90)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _compile_row_kernel(variant: str, scaled: bool = False):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import selection_kernel_resources as res

    from sparrow_server.kernels import sparse_decode as K

    consts, options = res.row_kernel_launch(variant, scaled)
    types = {**res.ROW_TYPES, **(res.FLOAT8_LANDMARK_TYPES if scaled else {})}
    return res.compile_kernel(K._row_kernel, types, consts, options, 90), options


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["fused_hist64", "fused_exit_narrow", "fused_packed_narrow",
                                     "fused_rolled_narrow", "fused_atomic_narrow", "fused_topdigits_narrow",
                                     "fused_joint_narrow", "fused_hoisted_narrow", "fused_qcopy_narrow",
                                     "fused_kvstore_narrow"])
def test_fused_row_kernel_compiles_for_sm90_with_two_programs_per_sm(variant):
    from sparrow_server.kernels import sparse_decode as K

    kernel, options = _compile_row_kernel(variant)
    threads = options["num_warps"] * 32
    assert options["maxnreg"] * threads * 2 <= SM_REGISTERS
    assert 2 * kernel.metadata.shared <= SM_SHARED_BYTES, kernel.metadata.shared
    # the row loop's pipeline: stages - 1 landmark tiles (pages x 128 bf16) in flight
    assert kernel.metadata.shared >= (K.ROW_STAGES - 1) * K.ROW_BLOCK_P * 128 * 2, kernel.metadata.shared


@pytest.mark.timeout(300)
def test_the_default_row_kernel_compiles_with_float8_landmarks():
    """Float8 landmarks (scaled: each page's scale gathered beside its landmark row, the landmark update's scale
    written) keep the default fused launch at two row programs an SM, its pipeline's tiles half bfloat16's. (Under
    its 64-register cap the row kernel keeps a small stack either way: 56 bytes with bfloat16 landmarks, 64 with
    float8: benchmarks/results/speed/call43/float8_roofline_and_compile.log; the split grid's scoring below spills
    nothing.)"""
    from sparrow_server.kernels import DEFAULT_SELECT_VARIANT
    from sparrow_server.kernels import sparse_decode as K

    kernel, options = _compile_row_kernel(DEFAULT_SELECT_VARIANT, scaled=True)
    bf16, _ = _compile_row_kernel(DEFAULT_SELECT_VARIANT)
    assert options["maxnreg"] * options["num_warps"] * 32 * 2 <= SM_REGISTERS
    assert (K.ROW_STAGES - 1) * K.ROW_BLOCK_P * 128 <= kernel.metadata.shared < bf16.metadata.shared
    assert 2 * kernel.metadata.shared <= SM_SHARED_BYTES


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["fused_hoisted_narrow", "fused_qcopy_narrow", "fused_kvstore_narrow"])
def test_split_score_kernel_compiles_for_sm90(variant):
    """The split scoring a fused variant runs past its fused rows, with (``fused_qcopy_narrow``: the query strided,
    its first program of each request copying it; ``fused_kvstore_narrow``: also the step's K and V stored by the
    landmark's program) and without the query copy, compiles for sm_90 unspilled."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import selection_kernel_resources as res

    from sparrow_server.kernels import sparse_decode as K

    consts, options = res.score_kernel_launch(variant, 40960 // 16)
    assert consts["COPY_Q"] == (variant != "fused_hoisted_narrow")
    assert consts["STORE_KV"] == (variant == "fused_kvstore_narrow")
    line = res.kernel_resources(res.compile_kernel(K._score_kernel, res.SCORE_TYPES, consts, options, 90))
    assert "STACK:0" in line.replace(" ", ""), line
    if variant == "fused_kvstore_narrow":  # the default's split grid with float8 landmarks too
        consts, options = res.score_kernel_launch(variant, 40960 // 16, scaled=True)
        types = {**res.SCORE_TYPES, **res.FLOAT8_LANDMARK_TYPES}
        line = res.kernel_resources(res.compile_kernel(K._score_kernel, types, consts, options, 90))
        assert "STACK:0" in line.replace(" ", ""), line


@pytest.mark.timeout(300)
def test_a_top_k_tier_compiles_alone_for_its_sass_counts():
    """``selection_kernel_resources.py --tiers`` compiles a top-k tier alone (its call into the kernel's tier
    function must follow that function's signature) and counts its block barriers: a second register block adds
    its own reductions."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import selection_kernel_resources as res

    one, two = (res.tier_sass_counts(1024, tail, "fused_exit_narrow", 90) for tail in (0, 512))
    assert 0 < one["barriers"] < two["barriers"] and one["instructions"] < two["instructions"]
    packed = res.tier_sass_counts(1024, 512, "fused_packed_narrow", 90)
    assert packed["barriers"] < two["barriers"]  # what the packed steps are for


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hoist", [False, True])
def test_the_phase_profile_kernel_compiles_with_its_timer_reads(hoist):
    """``selection_phase_profile.py``'s stamped row kernel (the interpreter runs it without its PTX) compiles for
    sm_90 with a cycle-counter and a global-timer read at each of its stamps, under the row kernel's register
    cap, no spill."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import selection_kernel_resources as res
    import selection_phase_profile as prof

    consts = dict(H=8, G=2, D=128, PS=16, BLOCK_P=128, STAGES=3, SMALL=512, ROW=2048, TAIL=256, ROLLED=False,
                  ATOMIC=0, JOINT=2 if hoist else 0, HOIST=hoist, NSTAMP=prof.STAMPS, STAMP=True)
    kernel = res.compile_kernel(prof._stamped_row_kernel, {**res.ROW_TYPES, "stamps_ptr": "*i64"}, consts,
                                {"num_warps": 16, "maxnreg": 64}, 90)
    sass = res.cuobjdump(kernel, "-sass")
    # a round the early exit skips still stamps its histogram's end (in the other branch): more reads than stamps
    assert sass.count("SR_GLOBALTIMER") >= prof.STAMPS and sass.count("SR_CLOCK") >= prof.STAMPS, sass.count("SR_CLOCK")
    assert "STACK:0" in res.kernel_resources(kernel)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("linear", [False, True], ids=["gather", "linear"])
def test_landmark_read_kernel_compiles_for_sm90_pipelined(linear):
    """The kernel bench's read-only floor for the scoring (``benchmarks/landmark_read.py``) compiles for sm_90 with its
    loop pipelined (stages - 1 tiles of bf16 landmark rows in shared memory), so that it reads as a streaming kernel."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import landmark_read as L
    import selection_kernel_resources as res

    types = dict(lm_ptr="*bf16", r2t_ptr="*i32", rpi_ptr="*i64", lo_ptr="*i32", hi_ptr="*i32", base_ptr="*i32",
                 out_ptr="*fp32", r2t_stride="i32")
    consts = dict(NPROG=16, PS=16, ROW=8 * 128, BLOCK_P=L.READ_BLOCK_P, STAGES=L.READ_STAGES, LINEAR=linear)
    kernel = res.compile_kernel(L._row_sums_kernel, types, consts, {"num_warps": 4}, 90)
    assert kernel.metadata.shared >= (L.READ_STAGES - 1) * L.READ_BLOCK_P * 8 * 128 * 2, kernel.metadata.shared
    assert "STACK:0" in res.kernel_resources(kernel).replace(" ", "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scaled", [False, True], ids=["bfloat16", "float8"])
def test_whole_page_score_kernel_compiles_for_sm90_at_its_programs_per_sm(scaled):
    """The scoring past the fused rows by whole pages (``fused_pages_narrow``) compiles for sm_90 with its loop
    pipelined (stages - 1 tiles of every KV head's landmarks of PAGE_TILE pages in shared memory), unspilled, and
    PAGE_PROGRAMS_PER_SM of its programs fit an SM by registers and by shared memory."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import selection_kernel_resources as res

    from sparrow_server.kernels import page_scores_whole as W
    from sparrow_server.kernels import sparse_decode as K

    consts, options = res.whole_page_kernel_launch("fused_pages_narrow", scaled)
    types = {**res.WHOLE_PAGE_TYPES, **(res.FLOAT8_LANDMARK_TYPES if scaled else {})}
    kernel = res.compile_kernel(W._whole_page_score_kernel, types, consts, options, 90)
    line = res.kernel_resources(kernel).replace(" ", "")
    registers, stack = (int(re.search(f"{key}:(\\d+)", line).group(1)) for key in ("REG", "STACK"))
    assert W.PAGE_PROGRAMS_PER_SM * registers * options["num_warps"] * 32 <= SM_REGISTERS, line
    assert W.PAGE_PROGRAMS_PER_SM * kernel.metadata.shared <= SM_SHARED_BYTES, kernel.metadata.shared
    assert kernel.metadata.shared >= (K.ROW_STAGES - 1) * W.PAGE_TILE * 8 * 128 * (1 if scaled else 2)
    assert stack == 0, line
