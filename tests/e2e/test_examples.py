"""examples/grpo_loop.py against a real server subprocess on a tiny random model: two GRPO steps
in-process, the loop closed (the server serves the trainer's updated weights), both transports."""
from __future__ import annotations

import sys

import pytest
import torch

from helpers.server_util import REPO, CharTokenizer, ServerProcess, free_port
from helpers.tiny_models import load_plain, save_tiny_model, teacher_forced_logprobs
from sparrow_server.client import SparrowClient

sys.path.insert(0, str(REPO / "examples"))
import grpo_loop  # noqa: E402
from grpo.fleet_sync import DEMO_SCHEDULE_NAME  # noqa: E402
from grpo.objective import group_advantages  # noqa: E402
from grpo.tasks import Problem, arithmetic_problems, exact_match_reward, last_integer  # noqa: E402

LR = 1e-2  # large enough that the updated weights are told apart from the initial ones


def letter_variety(text: str, problem: Problem) -> float:
    """A reward that varies within a group on a random model (exact match is always 0 there)."""
    return len(set(text)) / 26


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("grpo") / "model")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """One server for the module: every run starts by pushing its own initial weights (sync_initial)."""
    root = tmp_path_factory.mktemp("grpo-server")
    proc = ServerProcess(model_dir, root / "state", "--adapter-root", str(root))
    proc.adapter_root = root
    yield proc
    proc.stop()


def config(server, tmp_path, **overrides) -> grpo_loop.LoopConfig:
    base = dict(servers=(server.url,), steps=2, prompts_per_step=2, samples_per_prompt=3, max_new_tokens=12,
                lr=LR, out_dir=str(tmp_path / "run"), sync_initial=True)
    return grpo_loop.LoopConfig(**{**base, **overrides})


def test_two_steps_close_the_loop(server, model_dir, tmp_path):
    model = load_plain(model_dir, attn="sdpa")
    logs = grpo_loop.run_loop(config(server, tmp_path), model, CharTokenizer(), letter_variety, echo=lambda _: None)

    assert [x.step for x in logs] == [1, 2]
    assert logs[0].sampled_weight_versions == ("0",) and logs[1].sampled_weight_versions == ("1",)
    assert [x.pushed_weight_version for x in logs] == ["1", "2"]
    for x in logs:
        assert x.schedules_served == (DEMO_SCHEDULE_NAME,) and x.samples == 6
        assert x.kv_budget_tokens_mean < 60  # prompts alone are ~60 tokens: the decode was sparse
        assert 0 < x.tis_mean and x.tis_max <= 2.0 + 1e-12 and 0 < x.acceptance_est <= 1
        assert x.completion_tokens == 6 * 12 and x.rollout_tokens_per_s > 0 and x.grad_norm > 0
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["policy-step-2"]

    # The server now serves the trainer's weights: dense logprobs match a local forward, and differ
    # from the initial model's.
    _assert_serves_the_trainers_weights(server, model, model_dir)


def _assert_serves_the_trainers_weights(server, model, model_dir):
    """Dense logprobs at weight version 2 match a local forward of the trained model, not the initial one."""
    prompt = [0, 5, 9, 17, 33, 2, 70, 11]
    with SparrowClient(server.url) as client:
        served = client.rollout(input_ids=prompt, schedule="dense", sampling_params={"max_new_tokens": 8, "seed": 3})
    assert served.meta.weight_version == "2"
    with torch.no_grad():
        trained = teacher_forced_logprobs(model.eval(), prompt, served.token_ids)
        initial = teacher_forced_logprobs(load_plain(model_dir), prompt, served.token_ids)
    assert max(abs(a - b) for a, b in zip(served.logprobs, trained)) < 1e-4
    assert max(abs(a - b) for a, b in zip(served.logprobs, initial)) > 1e-3


def test_distributed_weight_sync_closes_the_loop(server, model_dir, tmp_path):
    """``--weight-sync distributed --sync-backend gloo``: the policy's parameters go over a process group
    (``sparrow_server.client.weight_broadcast``), no checkpoint is written, and the server then serves
    the trainer's weights."""
    cfg = config(server, tmp_path, weight_sync="distributed", sync_backend="gloo", master_port=free_port())
    model = load_plain(model_dir, attn="sdpa")
    logs = grpo_loop.run_loop(cfg, model, CharTokenizer(), letter_variety, echo=lambda _: None)

    assert [x.sampled_weight_versions for x in logs] == [("0",), ("1",)]
    assert all(x.grad_norm > 0 and x.kv_budget_tokens_mean < 60 for x in logs)
    assert not (tmp_path / "run" / "checkpoints").exists()
    _assert_serves_the_trainers_weights(server, model, model_dir)


def test_generate_transport_and_dense_tis(server, model_dir, tmp_path):
    """/generate (the router's route) with the schedule in custom_params; with the dense schedule the
    trainer's dense logprobs equal the server's, so every TIS weight and acceptance is 1."""
    cfg = config(server, tmp_path, via_router=server.url, schedule="dense", steps=1)
    logs = grpo_loop.run_loop(cfg, load_plain(model_dir, attn="sdpa"), CharTokenizer(), letter_variety,
                              echo=lambda _: None)
    (x,) = logs
    assert x.schedules_served == ("dense",) and x.sampled_weight_versions == ("0",)
    assert abs(x.tis_mean - 1) < 1e-3 and abs(x.acceptance_est - 1) < 1e-3


def test_distill_step_and_publish(server, model_dir, tmp_path):
    """DistillSparse every step; each adapter is published under its own name, the alias moves to it
    and the previous version unloads; step 2 samples through the alias."""
    adapters = server.adapter_root / "adapters"
    cfg = config(server, tmp_path, distill_every=1, distill_steps=1, publish=True, adapter_dir=str(adapters))
    # The adapter of step 2 is trained on the step-2 weights the server was just given: the server
    # must fingerprint its base at load time, not once before the updates.
    logs = grpo_loop.run_loop(cfg, load_plain(model_dir, attn="sdpa"), CharTokenizer(), letter_variety,
                              echo=lambda _: None)
    assert all(x.distill_s > 0 for x in logs)
    assert (adapters / "distill-step-2" / "adapter_config.json").is_file()
    with SparrowClient(server.url) as client:
        listed = client.http.get("/adapters").json()
    assert [x.adapter for x in logs] == ["distill-latest", "distill-latest"]
    assert listed["aliases"] == {"distill-latest": "distill-step-2"}
    assert [a["name"] for a in listed["adapters"]] == ["distill-step-2"]


def test_advantages_and_reward():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = group_advantages(rewards)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4, dtype=torch.float64))  # no signal in a uniform group
    problem = Problem("What is 17+25? Answer with the number.", 42)
    assert exact_match_reward("17 + 25 = 42", problem) == 1.0
    assert exact_match_reward("The answer is 41.", problem) == 0.0 and last_integer("none") is None


def test_context_examples_lengthen_the_questions_and_keep_the_answers():
    bare, long = arithmetic_problems(8, 3), arithmetic_problems(8, 3, context_examples=48)
    assert [p.answer for p in long] == [p.answer for p in bare]  # same questions, same seed
    assert all(lp.question.endswith(bp.question) and len(lp.question.splitlines()) == 49 for lp, bp in zip(long, bare))
    assert len({lp.question.splitlines()[0] for lp in long}) > 1  # each question has its own examples
    assert arithmetic_problems(8, 3, context_examples=48) == long
    for line in long[0].question.splitlines()[:-1]:
        a, b, s = map(int, line.replace("+", " ").replace("=", " ").split())
        assert a + b == s
    with pytest.raises(ValueError, match="context_examples = -1"):
        arithmetic_problems(2, 0, context_examples=-1)


def test_config_names_the_bad_field(tmp_path):
    with pytest.raises(ValueError, match="samples_per_prompt = 1"):
        grpo_loop.LoopConfig(servers=("http://x",), samples_per_prompt=1)
    with pytest.raises(ValueError, match="servers"):
        grpo_loop.LoopConfig(servers=())
    with pytest.raises(ValueError, match="weight_sync = 'nfs'"):
        grpo_loop.LoopConfig(servers=("http://x",), weight_sync="nfs")
    with pytest.raises(ValueError, match="device = 'cpu'"):
        grpo_loop.LoopConfig(servers=("http://x",), weight_sync="distributed", sync_backend="nccl")
    parsed = grpo_loop.parse_args(["--server", "http://x", "--device", "cuda:0", "--weight-sync", "distributed",
                                   "--sync-backend", "nccl", "--master-port", "29700"])
    assert (parsed.device, parsed.weight_sync, parsed.sync_backend, parsed.master_port) == \
        ("cuda:0", "distributed", "nccl", 29700)


def test_batched_dense_logprobs_match_per_sequence_forward():
    """Right-padded batch forward = ``dense_logits`` of each sequence alone (float64 model)."""
    from grpo.objective import sampled_token_logprobs
    from grpo.sampling import Sample
    from helpers.tiny_models import tiny_model
    from sparrow_server.modeling.sparse_forward import dense_logits

    model = tiny_model().double()
    samples = [Sample(0, tuple(range(1, 1 + p)), tuple(range(40, 40 + g)), (0.0,) * g, "dense", None, "0", None)
               for p, g in ((5, 7), (12, 3), (3, 20))]
    with torch.no_grad():
        batched = sampled_token_logprobs(model, samples, temperature=0.7)
        for x, got in zip(samples, batched):
            ids = torch.tensor(x.prompt_ids + x.token_ids)
            rows = torch.log_softmax(dense_logits(model, ids).double()[len(x.prompt_ids) - 1: -1] / 0.7, dim=-1)
            want = rows.gather(1, ids[len(x.prompt_ids):, None])[:, 0]
            assert torch.allclose(got.double(), want, atol=1e-5)


@pytest.mark.slow
def test_through_the_real_router(server, model_dir, tmp_path):
    """``--via-router``: /generate through sglang-router. The router drops ``custom_params`` but keeps
    ``extra_key``, which the client also fills, so the asked schedule serves (the server default is dense)."""
    from helpers import fleet_util

    if not fleet_util.router_available():
        pytest.skip("sglang-router is not installed")
    (tmp_path / "router").mkdir()
    with fleet_util.running_router([server.url], tmp_path / "router") as router:
        cfg = config(server, tmp_path, via_router=router.url, steps=1)
        (x,) = grpo_loop.run_loop(cfg, load_plain(model_dir, attn="sdpa"), CharTokenizer(), letter_variety,
                                  echo=lambda _: None)
    assert x.schedules_served == (DEMO_SCHEDULE_NAME,) and x.samples == 6
    assert x.kv_budget_tokens_mean < 60 and x.sampled_weight_versions == ("0",)


def test_fleet_cost_table_matches_docs_and_peft(tmp_path):
    """docs/scaling.md's per-GPU rows are what examples/fleet_cost_table.py prints, and its LoRA size
    formula equals peft's trainable-parameter count."""
    import fleet_cost_table as fct
    from peft import LoraConfig, get_peft_model

    from helpers.tiny_models import tiny_model

    doc = (REPO / "docs" / "scaling.md").read_text()
    for row in fct.rows(bounded=True):
        line = (f"| {row.hardware.upper()} | {row.model} | {row.gen_len // 1024}K | {row.batch} | {row.dense:,.0f} | "
                f"{row.sparse:,.0f} | {row.speedup:.2f}x |")
        assert line in doc, line
    model = tiny_model("qwen3")
    model.config.save_pretrained(tmp_path)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert fct.lora_params(str(tmp_path / "config.json"), rank=4) == trainable
