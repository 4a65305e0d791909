"""benchmarks/decode_profile.py counts every FlashInfer decode kernel as attention, whichever kernel SGLang
chose: from a GQA group of 4 (Qwen3-4B) it decodes with FlashInfer's prefill kernel (tensor cores), which the
first 4B profile filed under "other" (3.3 µs of attention per layer, `speed/call21/profile_4b/`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks/results/speed/call21/profile_4b"
TENSOR_CORE = "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<...>>(...)"
CUDA_CORE = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, ...>(...)"


def _profile():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decode_profile

    return decode_profile


def test_every_flashinfer_decode_kernel_is_attention():
    D = _profile()
    for name in (TENSOR_CORE, CUDA_CORE, "void flashinfer::PersistentVariableLengthMergeStatesKernel<8u>(...)"):
        assert D.kernel_class(name) == "attention", name
    assert D.kernel_class("_score_kernel") == D.kernel_class("_row_kernel") == "selection"  # split and fused
    assert D.kernel_class("nvjet_sm90_tst_192x48_64x7_4x1_v_bz_TNT") == "other"


def test_tables_rebuild_from_the_saved_kernels_of_a_run(tmp_path):
    """The committed 4B run: its dense layers are read at ~4.2 TB/s by the tensor-core kernel, each of its 34
    sparse layers has one selection pass and one attention read (the CUDA-core kernel, at ~2.1 TB/s)."""
    for backend in ("flashinfer", "sparrow"):
        (tmp_path / f"replay-kernels-{backend}.json").write_text((PROFILE / f"replay-kernels-{backend}.json").read_text())
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/decode_profile.py"), "--size", "qwen3-4b",
                           "--context", "16384", "--batch", "48", "--from-kernels", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    dense, sparse = json.loads((tmp_path / "decode_profile.json").read_text())["backends"]
    layers = lambda b: [r for r in b["segments"] if r["segment"] != "tail"]
    assert len(layers(dense)) == len(layers(sparse)) == 36
    assert all(4.0 < r["attn_TBps"] < 4.4 for r in layers(dense))
    sparse_layers = [r for r in layers(sparse) if r["us_selection"] > 0]
    assert len(sparse_layers) == 34 and all(1.9 < r["attn_TBps"] < 2.3 for r in sparse_layers)
    assert all(4.0 < r["attn_TBps"] < 4.4 for r in layers(sparse) if r["us_selection"] == 0)  # its 2 dense layers
    assert (tmp_path / "decode_profile.md").read_text() == (PROFILE / "decode_profile.md").read_text()
