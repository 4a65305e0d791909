"""Cost model: parameter counts vs HF models, roofline vs an explicit per-step loop, paper formulas."""
from __future__ import annotations

import json
import math

import pytest
import torch

from sparrow_server.cost.hardware import HARDWARE_PRESETS, Hardware, resolve_hardware
from sparrow_server.cost.model_shape import (
    MODEL_PRESETS, ModelShape, ModelShapeError, load_model_shape, model_shape_from_config, resolve_model,
)
from sparrow_server.cost.paper import appendix_f_attention_term, dense_cost, paper_cost, sparse_cost
from sparrow_server.cost.roofline import (
    LANDMARK_BYTES, landmark_element_bytes, predicted_speedup, rollout_estimate, rollout_waves, roofline_bytes,
    step_flops_and_bytes, step_time_s,
)
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule, budget_tokens, dense_schedule

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def _hf_param_count(config_cls, model_cls, **kw):
    torch.manual_seed(0)
    model = model_cls(config_cls(**kw))
    return sum(p.numel() for p in model.parameters()), model.config.to_dict()


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_param_count_matches_hf_model(family, tied):
    import transformers as tf

    classes = {
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
    }[family]
    n, config = _hf_param_count(*classes, tie_word_embeddings=tied, **TINY)
    shape = model_shape_from_config(config)
    assert shape.params == n
    assert shape.tie_embeddings is tied
    assert shape.kv_dim == 3 * 2 * 16 and shape.gqa_ratio == 2


def test_qwen3_presets_match_published_sizes():
    # Qwen3 model cards: total / non-embedding parameters (B).
    published = {"qwen3-1.7b": (1.7, 1.4), "qwen3-4b": (4.0, 3.6), "qwen3-8b": (8.2, 6.95), "qwen3-14b": (14.8, 13.2)}
    for name, (total, non_emb) in published.items():
        m = MODEL_PRESETS[name]
        assert m.params / 1e9 == pytest.approx(total, abs=0.05)
        untied_head = 0 if m.tie_embeddings else m.embedding_params
        assert (m.params - m.embedding_params - untied_head) / 1e9 == pytest.approx(non_emb, abs=0.05)
    m = MODEL_PRESETS["qwen3-1.7b"]
    assert m.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2


def test_config_file_round_trip_and_errors(tmp_path):
    config = {"model_type": "qwen3", "torch_dtype": "bfloat16", "tie_word_embeddings": True,
              "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936}
    (tmp_path / "Qwen3-1.7B").mkdir()
    path = tmp_path / "Qwen3-1.7B" / "config.json"
    path.write_text(json.dumps(config))
    shape = load_model_shape(path.parent)
    assert shape.name == "Qwen3-1.7B"
    assert shape.params == MODEL_PRESETS["qwen3-1.7b"].params
    assert resolve_model(str(path)).params == shape.params
    assert resolve_model("Qwen3-8B") is MODEL_PRESETS["qwen3-8b"]
    with pytest.raises(ModelShapeError, match="'intermediate_size'"):
        model_shape_from_config({k: v for k, v in config.items() if k != "intermediate_size"})
    with pytest.raises(ModelShapeError, match="'num_experts'"):
        model_shape_from_config({**config, "num_experts": 8})
    with pytest.raises(ModelShapeError, match="'num_kv_heads'"):
        model_shape_from_config({**config, "num_key_value_heads": 5})
    with pytest.raises(ModelShapeError, match="'model'"):
        resolve_model("no-such-model")


def test_hardware_presets_and_overrides():
    h = resolve_hardware("H100")
    assert h.peak_flops == 798e12 and h.mem_bytes_per_s == 3.0e12
    h2 = h.with_overrides(mem_bytes_per_s=1e12)
    assert h2.mem_bytes_per_s == 1e12 and h2.peak_flops == h.peak_flops
    with pytest.raises(ValueError, match="hardware"):
        resolve_hardware("tpu")
    with pytest.raises(ValueError, match="'peak_flops'"):
        Hardware("x", 0, 1)
    with pytest.raises(ValueError, match="'sparse_page_s'"):
        Hardware("x", 1, 1, sparse_page_s=-1e-9)
    with pytest.raises(ValueError, match="unknown"):
        h.with_overrides(page_s=1.0)
    assert h.with_overrides(sparse_page_s=1e-9).sparse_page_s == 1e-9 and h.roofline().is_roofline


def _loop_rollout_time(model, schedule, prompt_len, gen_len, hw, batch):
    """Explicit per-step loop of the documented formulas, using the schedule API."""
    hq_hd, hkv_hd = model.num_q_heads * model.head_dim, model.num_kv_heads * model.head_dim
    dense_layers = [l for l in range(model.num_layers) if schedule.is_dense or l in schedule.dense_layers]
    total = 0.0
    for step in range(gen_len):
        L = prompt_len + step + 1
        n_pages = math.ceil(L / schedule.page_size)
        flops = 2 * model.matmul_params
        kv = 0.0
        for layer in range(model.num_layers):
            bp = math.inf if layer in dense_layers else budget_tokens(schedule, L, prompt_len) // schedule.page_size
            if n_pages <= bp:
                a, s = L, 0
            else:
                a = (bp - 1) * schedule.page_size + (L - (n_pages - 1) * schedule.page_size)
                s = n_pages - schedule.recent_pages
            flops += 4 * hq_hd * a + 2 * hkv_hd * s
            kv += 2 * hkv_hd * model.kv_bytes * a + s * hkv_hd * LANDMARK_BYTES
        nbytes = model.matmul_params * model.weight_bytes + batch * kv
        selecting = any(layer not in dense_layers for layer in range(model.num_layers)) and \
            n_pages > budget_tokens(schedule, L, prompt_len) // schedule.page_size
        step = max(batch * flops / hw.peak_flops, nbytes / hw.mem_bytes_per_s) + hw.step_overhead_s + hw.request_step_s * batch
        # per layer; per TFLOP of the linear layers; per GB of KV read on CUDA cores (a GQA group below 4) per GB
        # of KV held (every layer at L tokens)
        cuda_cores = model.num_q_heads // model.num_kv_heads < 4
        step += (hw.layer_step_s * model.num_layers + hw.matmul_tflop_s * batch * 2 * model.matmul_params / 1e12
                 + hw.cuda_core_kv_s * cuda_cores * (batch * kv / 1e9) * (batch * L * model.kv_bytes_per_token / 1e9))
        n_sparse = model.num_layers - len(dense_layers)
        if selecting:  # per sparse layer; per request and sparse layer; per scored page of each
            step += n_sparse * (hw.sparse_layer_step_s + batch * (hw.sparse_layer_request_s
                                                                  + hw.sparse_page_s * (n_pages - schedule.recent_pages)))
        total += step / batch
    return total


@pytest.mark.parametrize("basis", ["total", "generated"])
def test_rollout_estimate_matches_loop(basis):
    # GQA groups of 4 (tensor-core decode) and 2 (CUDA-core decode, which pays cuda_core_kv_s)
    models = [ModelShape("tiny", 256, 4, 8, 2, 32, 512, 1000, tie_embeddings=True),
              ModelShape("tiny-g2", 256, 4, 8, 4, 32, 512, 1000, tie_embeddings=True)]
    schedule = Schedule("s", budgets_tokens=(64, 96, 160), bin_tokens=100, length_basis=basis, dense_layers=(0,))
    for hw in (Hardware("hw", peak_flops=1e12, mem_bytes_per_s=1e10),
               Hardware("fitted", peak_flops=1e12, mem_bytes_per_s=1e10, step_overhead_s=2e-4, request_step_s=7e-6,
                        sparse_layer_step_s=5e-5, sparse_layer_request_s=3e-6, sparse_page_s=2e-8,
                        layer_step_s=3e-5, matmul_tflop_s=0.5, cuda_core_kv_s=1.0)):
        for model in models:
            for prompt_len, gen_len, batch in [(0, 400, 1), (37, 350, 8), (250, 120, 64)]:
                _check_against_loop(model, schedule, prompt_len, gen_len, batch, hw)


def _check_against_loop(model, schedule, prompt_len, gen_len, batch, hw):
    est = rollout_estimate(model, schedule, prompt_len, gen_len, samples=3, hardware=hw, batch=batch)
    loop = lambda sched: _loop_rollout_time(model, sched, prompt_len, gen_len, hw, batch)  # noqa: E731
    assert est.sparse_decode_s == pytest.approx(loop(schedule), rel=1e-12)
    assert est.dense_decode_s == pytest.approx(loop(dense_schedule()), rel=1e-12)
    assert est.speedup == pytest.approx((est.prefill_s + 3 * est.dense_decode_s) / (est.prefill_s + 3 * est.sparse_decode_s))
    assert est.decode_waves == (batch,)
    # a KV pool that holds 40% of the batch at full length: waves of that size, each a lockstep decode of every
    # length; the decode time per request is their total over the batch
    pool = (prompt_len + gen_len) * max(1, int(0.4 * batch))
    waves = rollout_waves(batch, prompt_len + gen_len, pool)
    assert sum(waves) == batch and max(waves) == max(1, int(0.4 * batch))
    pooled = rollout_estimate(model, schedule, prompt_len, gen_len, samples=3, hardware=hw, batch=batch,
                              kv_pool_tokens=pool)
    by_waves = lambda sched: sum(  # noqa: E731
        _loop_rollout_time(model, sched, prompt_len, gen_len, hw, b) * b for b in waves) / batch
    assert pooled.decode_waves == tuple(waves)
    assert pooled.sparse_decode_s == pytest.approx(by_waves(schedule), rel=1e-12)
    assert pooled.dense_decode_s == pytest.approx(by_waves(dense_schedule()), rel=1e-12)
    assert pooled.prefill_s == est.prefill_s


def test_speedup_properties():
    reg = ScheduleRegistry()
    model = MODEL_PRESETS["qwen3-4b"]
    hw = HARDWARE_PRESETS["h200"]
    assert predicted_speedup(model, dense_schedule(), 100, 30_000, hardware=hw) == pytest.approx(1.0)
    # a budget covering the whole sequence is dense
    huge = Schedule("huge", budgets_tokens=(65_536,))
    assert predicted_speedup(model, huge, 100, 30_000, hardware=hw) == pytest.approx(1.0)
    # tighter thresholds (bigger budgets) predict less speedup; longer generations predict more
    speedups = [predicted_speedup(model, reg.get(f"qwen3-4b-{t}"), 100, 32_000, hardware=hw)
                for t in ("0.75", "0.80", "0.86", "0.88", "0.90", "0.92")]
    assert all(a > b for a, b in zip(speedups, speedups[1:])) and speedups[-1] > 1
    s86 = reg.get("qwen3-4b-0.86")
    assert predicted_speedup(model, s86, 100, 8_000, hardware=hw) < predicted_speedup(model, s86, 100, 32_000, hardware=hw)
    # bigger models (same schedule) gain less: attention is a smaller share of their cost
    s = reg.get("qwen3-1.7b-0.86")
    by_size = [predicted_speedup(MODEL_PRESETS[m], s, 100, 32_000, hardware=hw) for m in ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")]
    assert by_size[0] > by_size[1] > by_size[2]
    with pytest.raises(ValueError, match="gen_len"):
        rollout_estimate(model, s, 0, 0)
    with pytest.raises(ValueError, match="batch"):
        rollout_estimate(model, s, 100, 1000, batch=0)
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        rollout_estimate(model, s, 100, 1000, batch=8, kv_pool_tokens=1099)
    # a pool that holds the whole batch changes nothing; one that holds fewer requests makes the rollout slower
    full = rollout_estimate(model, s, 100, 1000, batch=8, hardware=hw)
    assert rollout_estimate(model, s, 100, 1000, batch=8, hardware=hw, kv_pool_tokens=8 * 1100) == full
    assert rollout_estimate(model, s, 100, 1000, batch=8, hardware=hw, kv_pool_tokens=5 * 1100).dense_s > full.dense_s


def test_rollout_waves():
    # rollout A on the H200 (gpu_call15): the pool held 61 requests at full length, 3 ran after them
    assert rollout_waves(64, 1024 + 16384, 1_076_320, 64) == [61, 3]
    assert rollout_waves(32, 1024 + 16384, 593_920, 32) == [32]
    assert rollout_waves(70, 100, 10_000, 32) == [32, 32, 6]
    assert rollout_waves(70, 100) == [70] and rollout_waves(70, 100, max_running=64) == [64, 6]
    with pytest.raises(ValueError, match="KV pool"):
        rollout_waves(1, 20_000, 10_000, 8)
    with pytest.raises(ValueError, match="requests"):
        rollout_waves(0, 100)


def test_roofline_bytes_hand_computed():
    model = MODEL_PRESETS["qwen3-1.7b"]
    schedule = Schedule("one", budgets_tokens=(2048,))
    rb = roofline_bytes(model, schedule, length=16_384, batch=32)
    per_token_layer = 2 * 8 * 128 * 2
    assert rb.dense.weights == rb.sparse.weights == model.params * 2
    assert rb.dense.kv == 32 * 28 * 16_384 * per_token_layer and rb.dense.landmarks == 0
    assert rb.sparse.kv == 32 * per_token_layer * (2 * 16_384 + 26 * 2048)
    assert rb.sparse.landmarks == 32 * 26 * (1024 - 2) * 8 * 128 * 2
    assert rb.attention_ratio == pytest.approx(rb.dense.kv / (rb.sparse.kv + rb.sparse.landmarks))
    assert 1 < rb.ratio < rb.attention_ratio
    # partial last page: A = (budget_pages - 1) * 16 + last_page_len
    _, b = step_flops_and_bytes(model, schedule, [16_390], 1)
    assert b.kv[0] == per_token_layer * (2 * 16_390 + 26 * (127 * 16 + 6))
    # float8 landmarks: one byte an element and a float32 scale per page and KV head (128 elements)
    f8 = roofline_bytes(model, schedule, length=16_384, batch=32,
                        landmark_bytes=landmark_element_bytes("float8_e4m3fn", 128))
    assert f8.sparse.landmarks == 32 * 26 * (1024 - 2) * 8 * (128 + 4) and f8.sparse.kv == rb.sparse.kv
    assert f8.dense == rb.dense and f8.ratio > rb.ratio


def test_landmark_element_bytes_cover_the_server_s_dtypes():
    from sparrow_server.sglang_plugin.config import LANDMARK_DTYPES

    assert [landmark_element_bytes(d, 128) for d in LANDMARK_DTYPES] == [2.0, 4.0, 1.03125]
    with pytest.raises(ValueError, match="int8"):
        landmark_element_bytes("int8", 128)


def test_landmark_dtype_prices_the_scoring_s_bytes(capsys):
    """The sparse server's landmark dtype (``--landmark-dtype``, its SPARROW_LANDMARK_DTYPE) costs the bytes its
    scoring reads: on the pure roofline a decode step differs by exactly those bytes at the bandwidth; the fitted
    preset keeps the order; the dense server reads no landmarks. The CLI reports the dtype it priced."""
    from sparrow_server.cli import main
    from sparrow_server.kernels import DEFAULT_LANDMARK_DTYPE, LANDMARK_STORAGE_DTYPES

    model, hardware = MODEL_PRESETS["qwen3-1.7b"], HARDWARE_PRESETS["h200"]
    schedule = ScheduleRegistry.load().get("qwen3-1.7b-0.86")
    lengths, batch, prompt = [32_768 + 128, 36_000], 16, 32_768
    per_element = {d: landmark_element_bytes(d, model.head_dim) for d in LANDMARK_STORAGE_DTYPES}
    roof = hardware.roofline()
    for dtype in ("float8_e4m3fn", "float32"):
        landmarks = {d: step_flops_and_bytes(model, schedule, lengths, batch, prompt, per_element[d])[1].landmarks
                     for d in (dtype, DEFAULT_LANDMARK_DTYPE)}
        step = {d: step_time_s(model, schedule, lengths, batch, roof, prompt, per_element[d])
                for d in (dtype, DEFAULT_LANDMARK_DTYPE)}
        assert step[dtype] - step[DEFAULT_LANDMARK_DTYPE] == pytest.approx(
            (landmarks[dtype] - landmarks[DEFAULT_LANDMARK_DTYPE]) / roof.mem_bytes_per_s, rel=1e-9)
    est = {d: rollout_estimate(model, schedule, 1024, 16_384, samples=1, hardware=hardware, batch=64, landmark_dtype=d)
           for d in LANDMARK_STORAGE_DTYPES}
    assert len({e.dense_decode_s for e in est.values()}) == 1
    assert est["float8_e4m3fn"].sparse_decode_s < est["bfloat16"].sparse_decode_s < est["float32"].sparse_decode_s
    assert rollout_estimate(model, schedule, 1024, 16_384, 1, hardware, 64) == est[DEFAULT_LANDMARK_DTYPE]
    args = ["cost", "--model", "qwen3-1.7b", "--schedule", "qwen3-1.7b-0.86", "--prompt-len", "1024", "--gen-len",
            "16384", "--samples", "1", "--batch", "64", "--json"]
    assert main(args + ["--landmark-dtype", "float8_e4m3fn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["landmark_dtype"] == "float8_e4m3fn"
    assert out["sparse_tokens_per_s"] == pytest.approx(est["float8_e4m3fn"].sparse_tokens_per_s, rel=1e-12)
    with pytest.raises(SystemExit) as exc:
        main(args + ["--landmark-dtype", "int8"])
    assert exc.value.code == 2 and "--landmark-dtype" in capsys.readouterr().err
    with pytest.raises(ValueError, match="int8"):
        rollout_estimate(model, schedule, 1024, 16_384, 1, hardware, 64, landmark_dtype="int8")


def test_paper_formulas():
    P, N, Lin, Lout, D, r, I = 1e9, 8, 100, 1000, 1024, 2, 3.0
    assert dense_cost(P, N, Lin, Lout, D, r, I) == pytest.approx(
        2 * P * N * Lout + r * (2 * Lin + Lout) * Lout * N * D + I * (2 * Lin * Lout * D + N * Lout**2 * D))
    B, ps = 512, 16
    assert sparse_cost(P, N, Lin, Lout, D, r, I, B, ps) == pytest.approx(
        2 * N * P * Lout + 2 * r * N * D * B * Lout + 2 * I * N * D * B * Lout
        + 2 * N * Lin * D * Lout + r * N * D * Lout**2 / (2 * ps) + 2 * I * Lin * D * Lout + I * N * D * Lout**2 / (2 * ps))
    # K beyond the whole sequence: Appendix F's term is the dense one, (2 L_in + L_out) L_out
    assert appendix_f_attention_term(Lin, Lout, 10_000) == (2 * Lin + Lout) * Lout
    assert appendix_f_attention_term(Lin, Lout, 600) == (2 * Lin + 500) * 500 + 2 * 600 * 500
    assert appendix_f_attention_term(Lin, Lout, 50) == 2 * 50 * Lout
    pc = paper_cost(MODEL_PRESETS["qwen3-1.7b"], HARDWARE_PRESETS["h200"], 2048, 200, 32_000, 8)
    assert pc.speedup > 1


def test_step_overhead_adds_a_fixed_time_per_step():
    model, s = MODEL_PRESETS["qwen3-1.7b"], ScheduleRegistry().get("qwen3-1.7b-0.86")
    hw = HARDWARE_PRESETS["h100"].roofline()
    base = rollout_estimate(model, s, 100, 5000, 8, hw, 32)
    slow = rollout_estimate(model, s, 100, 5000, 8, hw.with_overrides(step_overhead_s=1e-3), 32)
    assert slow.dense_decode_s == pytest.approx(base.dense_decode_s + 5000 * 1e-3 / 32)
    assert slow.sparse_decode_s == pytest.approx(base.sparse_decode_s + 5000 * 1e-3 / 32)
    assert 1 < slow.speedup < base.speedup
    with pytest.raises(ValueError, match="step_overhead_s"):
        Hardware("x", 1, 1, step_overhead_s=-1)
