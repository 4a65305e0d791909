"""Dense verification: exact acceptance of reference-engine rollouts against float64 brute force,
the dense pass never uses the adapter, the top-k bound never exceeds the exact value, sampling,
backlog dropping, and the Prometheus metrics."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from helpers.engine_util import run_requests
from helpers.tiny_models import TINY_VOCAB, load_plain, tiny_model
from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.monitor import AcceptanceMetrics, DenseVerifier, HFScorer, VerificationJob
from sparrow_server.monitor.scoring import EXACT, TOPK_LOWER_BOUND, completion_basis_lengths
from sparrow_server.monitor.verifier import topk_from_chunks
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.acceptance import logits_to_topk

PROMPT = tuple((i * 5 + 2) % (TINY_VOCAB - 1) for i in range(40))
SPARSE = Schedule(name="tiny-sparse", budgets_tokens=(64,), dense_layers=(0,), threshold=0.9)
NEW_TOKENS = 60
TEMPERATURE = 1.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def rollout(model_dir):
    """A sparse rollout from the reference engine, with its recorded top-20, and the engine."""
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024)
    request = GenerationRequest(
        rid="r0", input_ids=PROMPT, schedule=SPARSE, top_logprobs=20,
        sampling=SamplingParams(max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE, seed=3, ignore_eos=True),
    )
    (out,) = run_requests(engine, request)
    yield engine, out
    asyncio.run(engine.shutdown())


def brute_acceptance(sparse_logits: torch.Tensor, dense_logits: torch.Tensor, temperature: float) -> np.ndarray:
    p = torch.softmax(sparse_logits.double() / temperature, -1).numpy()
    q = torch.softmax(dense_logits.double() / temperature, -1).numpy()
    return np.array([sum(min(a, b) for a, b in zip(p[t], q[t])) for t in range(p.shape[0])])


def test_exact_acceptance_of_an_engine_rollout(rollout, model_dir):
    engine, out = rollout
    local = engine.local_model()
    scorer = HFScorer(local.current, lock=local.step_lock)
    sparse = scorer.sparse_logits(PROMPT, out.tokens, SPARSE)
    # The teacher-forced sparse policy is the one that sampled: same logprob of every sampled token.
    logp = torch.log_softmax(sparse.double() / TEMPERATURE, -1)
    replayed = logp[torch.arange(len(out.tokens)), torch.tensor(out.tokens)].numpy()
    np.testing.assert_allclose(replayed, out.logprobs, atol=2e-4)
    # The dense side is the plain HF forward.
    plain = load_plain(model_dir, "eager")
    with torch.no_grad():
        full = plain(input_ids=torch.tensor([PROMPT + tuple(out.tokens)])).logits[0].float()
    dense_expected = full[len(PROMPT) - 1:-1]
    torch.testing.assert_close(scorer.dense_logits(PROMPT, out.tokens), dense_expected, atol=1e-4, rtol=1e-4)
    scores = scorer.exact(PROMPT, out.tokens, SPARSE, TEMPERATURE)
    assert scores.kind == EXACT
    np.testing.assert_allclose(scores.acceptance, brute_acceptance(sparse, dense_expected, TEMPERATURE), atol=1e-5)
    # Dense while the sequence fits the 64-token budget, sparse (and < 1) after it.
    fits = np.arange(len(out.tokens)) + len(PROMPT) <= 64
    np.testing.assert_allclose(scores.acceptance[fits], 1.0, atol=1e-5)
    assert scores.acceptance[~fits].min() < 0.999
    np.testing.assert_array_equal(scores.basis_lengths, np.arange(len(out.tokens)) + len(PROMPT))
    # The engine still serves after the scorer switched attention implementations on its model.
    (again,) = run_requests(engine, GenerationRequest(rid="r1", input_ids=PROMPT, schedule=SPARSE,
                                                      sampling=SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)))
    assert len(again.tokens) == 8


def test_topk_bound_never_exceeds_exact(rollout):
    engine, out = rollout
    local = engine.local_model()
    scorer = HFScorer(local.current, lock=local.step_lock)
    verifier = DenseVerifier(scorer)
    exact = verifier.score(VerificationJob("e", SPARSE, PROMPT, tuple(out.tokens), TEMPERATURE)).scores
    bound = verifier.score(VerificationJob("b", SPARSE, PROMPT, tuple(out.tokens), TEMPERATURE,
                                           sparse_topk=topk_from_chunks(out.top))).scores
    assert bound.kind == TOPK_LOWER_BOUND
    assert np.all(bound.acceptance <= exact.acceptance + 1e-6)
    # Brute force over the two top-20 lists (sparse: teacher-forced, dense: plain forward).
    sp = torch.log_softmax(scorer.sparse_logits(PROMPT, out.tokens, SPARSE).double(), -1).exp().numpy()
    dn = torch.log_softmax(scorer.dense_logits(PROMPT, out.tokens).double(), -1).exp().numpy()
    expected = [sum(min(sp[t, v], dn[t, v]) for v in set(np.argsort(-sp[t])[:20]) & set(np.argsort(-dn[t])[:20]))
                for t in range(len(out.tokens))]
    np.testing.assert_allclose(bound.acceptance, expected, atol=1e-4)
    # With the whole vocabulary recorded the bound is the exact value.
    full = logits_to_topk(scorer.sparse_logits(PROMPT, out.tokens, SPARSE), TINY_VOCAB, TEMPERATURE)
    whole = verifier.score(VerificationJob("w", SPARSE, PROMPT, tuple(out.tokens), TEMPERATURE, sparse_topk=full))
    np.testing.assert_allclose(whole.scores.acceptance, exact.acceptance, atol=1e-5)
    verifier.close()


def test_dense_pass_never_applies_the_adapter():
    from peft import LoraConfig, get_peft_model

    base = tiny_model("llama", seed=1)
    with torch.no_grad():
        ids = torch.tensor([PROMPT + PROMPT[:20]])
        base_logits = base(input_ids=ids).logits[0, len(PROMPT) - 1:-1].float()
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"],
                                           init_lora_weights=False), adapter_name="a1").eval()
    scorer = HFScorer(lora)
    torch.testing.assert_close(scorer.dense_logits(PROMPT, PROMPT[:20]), base_logits, atol=1e-5, rtol=1e-5)
    dense = Schedule(name="d")
    with_adapter = scorer.sparse_logits(PROMPT, PROMPT[:20], dense, adapter="a1")
    without = scorer.sparse_logits(PROMPT, PROMPT[:20], dense, adapter=None)
    assert (with_adapter - without).abs().max() > 1e-3  # the adapter does change the sparse policy
    torch.testing.assert_close(without, base_logits, atol=1e-4, rtol=1e-4)
    scores = scorer.exact(PROMPT, PROMPT[:20], dense, 1.0, adapter="a1")
    assert scores.acceptance.min() < 0.999  # the rollout policy (adapter) differs from the dense base


def test_sampling_fraction():
    verifier = DenseVerifier(scorer=None, sample_fraction=0.05, seed=0)
    picks = [verifier.should_verify(False) for _ in range(20_000)]
    assert abs(np.mean(picks) - 0.05) < 0.01
    assert all(verifier.should_verify(True) for _ in range(10))
    never = DenseVerifier(scorer=None, sample_fraction=0.0)
    assert not any(never.should_verify(False) for _ in range(1000))
    with pytest.raises(ValueError, match="sample_fraction"):
        DenseVerifier(scorer=None, sample_fraction=1.5)


class BlockedScorer:
    """Scores constant acceptance once released; lets a test hold the worker busy."""

    def __init__(self):
        self.release = threading.Event()

    def exact(self, prompt_ids, completion_ids, schedule, temperature, adapter=None, sparse_logits=None):
        from sparrow_server.monitor.scoring import AcceptanceScores

        self.release.wait(timeout=30)
        n = len(completion_ids)
        return AcceptanceScores(np.full(n, 0.95), completion_basis_lengths(schedule, len(prompt_ids), n), EXACT)


def test_background_submit_returns_at_once_and_drops_sampled_jobs_when_backlogged():
    scorer = BlockedScorer()
    verifier = DenseVerifier(scorer, AcceptanceMetrics(CollectorRegistry()), max_pending=2)
    job = VerificationJob("s", SPARSE, PROMPT, (1, 2, 3), 1.0)
    futures = [verifier.submit(job) for _ in range(2)]
    assert all(f is not None for f in futures)
    assert verifier.submit(job) is None and verifier.dropped == 1  # a sampled job waits for no one
    forced = verifier.submit(VerificationJob("v", SPARSE, PROMPT, (1, 2, 3), 1.0, requested=True))
    assert forced is not None  # verify: true is never dropped
    scorer.release.set()
    result = forced.result(timeout=30)
    assert result.meta() == {"acceptance_p5": pytest.approx(0.95), "acceptance_mean": pytest.approx(0.95),
                             "acceptance_kind": EXACT, "verified_tokens": 3}
    verifier.close()
    assert verifier.pending == 0


def _sample(registry: CollectorRegistry, name: str, **labels) -> float | None:
    return registry.get_sample_value(name, labels)


def test_metrics_histogram_p5_and_violation_crossings():
    registry = CollectorRegistry()
    metrics = AcceptanceMetrics(registry, min_tokens=50)
    schedule = Schedule(name="s1", budgets_tokens=(64, 128), bin_tokens=100, threshold=0.86)
    rng = np.random.default_rng(0)
    good = rng.uniform(0.9, 1.0, 120)
    metrics.observe(schedule, good, np.arange(120))  # bin 0: 100 tokens, bin 1: 20 (unpublished)
    assert _sample(registry, "sparrow_acceptance_count", schedule="s1", length_bin="0") == 100
    assert _sample(registry, "sparrow_acceptance_count", schedule="s1", length_bin="1") == 20
    assert _sample(registry, "sparrow_acceptance_bucket", schedule="s1", length_bin="0", le="0.95") == np.sum(good[:100] <= 0.95)
    assert _sample(registry, "sparrow_acceptance_p5", schedule="s1", length_bin="0") == pytest.approx(np.quantile(good[:100], 0.05))
    assert _sample(registry, "sparrow_acceptance_p5", schedule="s1", length_bin="1") is None  # < min_tokens
    # the interval beside it: the window's order statistics (n = 100: x_(1) .. x_(11)), published with it
    ordered = np.sort(good[:100])
    assert _sample(registry, "sparrow_acceptance_p5_low", schedule="s1", length_bin="0") == ordered[0]
    assert _sample(registry, "sparrow_acceptance_p5_high", schedule="s1", length_bin="0") == ordered[10]
    assert metrics.rolling_p5_interval(schedule, 0) == (ordered[0], ordered[10])
    assert _sample(registry, "sparrow_acceptance_p5_low", schedule="s1", length_bin="1") is None
    assert _sample(registry, "sparrow_acceptance_threshold", schedule="s1") == 0.86
    assert _sample(registry, "sparrow_verified_tokens_total", schedule="s1") == 120
    assert _sample(registry, "sparrow_verified_requests_total", schedule="s1") == 1
    bad = np.full(100, 0.5)
    metrics.observe(schedule, bad, np.arange(100))  # bin 0 window: 100 good + 100 bad -> p5 0.5 < 0.86
    assert _sample(registry, "sparrow_acceptance_p5", schedule="s1", length_bin="0") == pytest.approx(0.5)
    assert _sample(registry, "sparrow_tail_violations_total", schedule="s1", length_bin="0") == 1
    metrics.observe(schedule, bad, np.arange(100))  # still below: not a new crossing
    assert _sample(registry, "sparrow_tail_violations_total", schedule="s1", length_bin="0") == 1
    # Far bins fold into the last label (bounded cardinality).
    metrics.observe(schedule, good[:10], np.full(10, 10_000))
    assert _sample(registry, "sparrow_acceptance_count", schedule="s1", length_bin="19") == 10
    text = generate_latest(registry).decode()
    for name in ("sparrow_acceptance_bucket", "sparrow_acceptance_p5", "sparrow_acceptance_p5_low",
                 "sparrow_acceptance_p5_high", "sparrow_acceptance_threshold",
                 "sparrow_tail_violations_total", "sparrow_verified_tokens_total", "sparrow_verified_requests_total"):
        assert name in text


def test_verifier_drops_a_job_whose_weights_changed_before_its_dense_pass():
    import numpy as np

    from sparrow_server.monitor.metrics import AcceptanceMetrics
    from sparrow_server.monitor.scoring import AcceptanceScores
    from sparrow_server.monitor.verifier import DenseVerifier, StaleVerificationError, VerificationJob
    from sparrow_server.sparsity.registry import ScheduleRegistry

    class Scorer:
        def exact(self, prompt_ids, completion_ids, schedule, temperature, adapter=None, sparse_logits=None):
            return AcceptanceScores(np.ones(len(completion_ids)), np.arange(len(completion_ids)), "exact")

    from prometheus_client import CollectorRegistry

    metrics = AcceptanceMetrics(CollectorRegistry())
    served = ["v2"]
    verifier = DenseVerifier(Scorer(), metrics, weight_version=lambda: served[0])
    job = VerificationJob(rid="r", schedule=ScheduleRegistry().get("dense"), prompt_ids=(1, 2), completion_ids=(3, 4),
                          temperature=1.0, weight_version="v1")
    with pytest.raises(StaleVerificationError):
        verifier.score(job)
    assert verifier.stale == 1
    served[0] = "v1"
    assert verifier.score(job).scores.n_tokens == 2 and verifier.stale == 1
    verifier.close()


def test_topk_lists_become_padded_tensors_in_order():
    """Ragged per-token lists: ids and logprobs in their order, -1 / -inf padding, ``k`` cuts longer rows."""
    from sparrow_server.monitor.verifier import topk_tensors

    ids, lps = topk_from_chunks([((-0.1, 7), (-2.5, 3)), (), ((-0.7, 9),)])
    assert ids.tolist() == [[7, 3], [-1, -1], [9, -1]] and ids.dtype == torch.long
    assert lps.tolist() == [[-0.1, -2.5], [float("-inf")] * 2, [-0.7, float("-inf")]] and lps.dtype == torch.float64
    ids, lps = topk_tensors([[(-0.1, 7), (-2.5, 3), (-4.0, 1)]], k=2)
    assert ids.tolist() == [[7, 3]] and lps.tolist() == [[-0.1, -2.5]]
    assert topk_tensors([], k=20)[0].shape == (0, 20)
