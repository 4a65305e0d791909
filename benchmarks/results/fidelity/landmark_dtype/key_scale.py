"""SmolLM2-135M's landmarks (page means of post-RoPE keys) over the first committed rollout (math-00: 67 + 2,048
tokens), per sparse layer: the share of elements float8 e4m3 rounds to zero (under 2^-10), the median and largest
magnitude, the share past e4m3's largest value (448). From the repository root:
    PYTHONPATH=. python benchmarks/results/fidelity/landmark_dtype/key_scale.py > .../key_scale.txt
"""
import json

import torch

from sparrow_server.models import load_model
from sparrow_server.modeling.sparse_forward import teacher_forced_logits
from sparrow_server.sparsity.schedule import load_schedule
from sparrow_server.sparsity.selection import batched_page_landmarks

torch.set_num_threads(2)
model = load_model(None).model
r = json.loads(open("benchmarks/results/fidelity/long/rollouts.jsonl").readline())
ids = torch.tensor([*r["prompt_ids"], *r["completion_ids"]][:-1])
schedule = load_schedule("benchmarks/results/fidelity/dense_layers/fixed-256-dense01.json")
stats = {}


def observe(layer, q, k):
    full = k.shape[0] // 16 * 16
    a = batched_page_landmarks(k[None, :full].float(), 16)[0].abs()
    stats[layer] = (float((a < 2**-10).float().mean()), float(a.median()), float(a.max()), float((a > 448).float().mean()))


with torch.inference_mode():
    teacher_forced_logits(model, ids, len(r["prompt_ids"]), schedule, observe=observe)
print(f"{r['id']}: layer, share rounded to zero, median |x|, max |x|, share over 448")
for layer in sorted(stats):
    print(layer, "%.4f %.3f %.1f %.4f" % stats[layer])
