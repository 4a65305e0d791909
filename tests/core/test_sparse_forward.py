"""The teacher-forced sparse forward of a real transformers model: dense schedule == HF forward;
sparse schedule changes only generated positions past the budget; dense layers stay dense."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from sparrow_server.modeling.sparse_forward import dense_logits, teacher_forced_logits
from sparrow_server.sparsity.schedule import Schedule, dense_schedule


def _tiny(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    model.set_attn_implementation("sdpa")
    return model.eval()


TIGHT = Schedule(name="tight", budgets_tokens=(64,), page_size=16, dense_layers=(0,))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_dense_schedule_equals_hf_forward(kind):
    model = _tiny(kind)
    ids = torch.randint(0, 97, (150,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = dense_logits(model, ids)
        got = teacher_forced_logits(model, ids, prompt_len=20, schedule=dense_schedule())
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_sparse_schedule_only_changes_positions_past_the_budget(kind):
    model = _tiny(kind)
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = dense_logits(model, ids)
        got = teacher_forced_logits(model, ids, prompt_len=10, schedule=TIGHT)
    # Up to 64 tokens (4 pages) the budget covers the whole sequence: exactly dense.
    torch.testing.assert_close(got[:64], ref[:64], rtol=1e-4, atol=1e-4)
    assert (got[100:] - ref[100:]).abs().max() > 1e-3
    assert model.config._attn_implementation == "sdpa"  # restored


def test_all_layers_dense_equals_hf_forward():
    model = _tiny("llama")
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(3))
    all_dense = Schedule(name="all-dense-layers", budgets_tokens=(64,), dense_layers=(0, 1, 2))
    with torch.no_grad():
        torch.testing.assert_close(teacher_forced_logits(model, ids, 10, all_dense), dense_logits(model, ids),
                                   rtol=1e-4, atol=1e-4)


def test_gradients_flow_for_distillation():
    model = _tiny("llama")
    ids = torch.randint(0, 97, (120,), generator=torch.Generator().manual_seed(4))
    logits = teacher_forced_logits(model, ids, prompt_len=10, schedule=TIGHT)
    logits[-1].logsumexp(-1).backward()
    assert model.model.layers[2].self_attn.q_proj.weight.grad.abs().sum() > 0


class _DeviceProbe(torch.nn.Module):
    """Stands in for a model on another device (meta here, CUDA on a GPU host): records where the
    input ids arrive, since a CUDA embedding rejects CPU indices."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, device="meta"))
        self.config = type("C", (), {"_attn_implementation": "sdpa"})()
        self.seen = []

    def set_attn_implementation(self, name):
        self.config._attn_implementation = name

    def forward(self, input_ids, use_cache=False):
        self.seen.append(input_ids.device)
        return type("Out", (), {"logits": torch.zeros(1, input_ids.shape[1], 5)})()


def test_ids_built_on_the_cpu_move_to_the_models_device():
    model = _DeviceProbe()
    teacher_forced_logits(model, torch.arange(20), prompt_len=4, schedule=TIGHT)
    dense_logits(model, torch.arange(20))
    assert [d.type for d in model.seen] == ["meta", "meta"]
    assert model.config._attn_implementation == "sdpa"  # switched back after the sparse forward
