# CPU replica of SGLang's dummy init (uniform +-1e-3, one seed per parameter) for Qwen3-1.7B's key/query path at
# one layer; the residual stream taken as the embedding (the layers' updates are ~1e-6 against ~1e-3).
import torch, math, numpy as np
torch.manual_seed(0)
V, Hd, nq, nk, D, ps = 151936, 2048, 16, 8, 128, 16
def dummy(*shape):
    g = torch.Generator().manual_seed(1234)
    return torch.empty(*shape).uniform_(-1e-3, 1e-3, generator=g)
L = 16384 + 64
emb = dummy(V, Hd)
toks = torch.randint(100, V - 100, (L,), generator=torch.Generator().manual_seed(0))
x = emb[toks]
w_ln = dummy(Hd)
h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w_ln
W = dummy((nq + 2 * nk) * D, Hd)
qkv = h @ W.T
q, k = qkv[:, :nq * D].view(L, nq, D), qkv[:, nq * D:(nq + nk) * D].view(L, nk, D)
w_n = dummy(D)
rms = lambda t: t / t.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w_n
q, k = rms(q), rms(k)
inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
ang = torch.arange(L).float()[:, None] * inv[None]
cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
rot = lambda t: torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
k = k * cos + rot(k) * sin
q = q * cos + rot(q) * sin
n = L // ps
lm = k.view(n, ps, nk, D).mean(1).to(torch.bfloat16).float()
qs = q[-1].view(nk, 2, D).mean(1)
scores = torch.einsum("hd,phd->hp", qs, lm)  # [nk, n]
sink, recent, count = 1, 2, 224
kk = count - sink - recent
cand = scores[:, sink:n - recent]
top = cand.topk(kk, dim=1).indices + sink
sets = [set(t.tolist()) for t in top]
jac = np.mean([len(a & b) / len(a | b) for i, a in enumerate(sets) for b in sets[i + 1:]])
adj = np.mean([sum((p - 1 in s) or (p + 1 in s) for p in s) / len(s) for s in sets])
C = n - recent - sink
rng = np.random.default_rng(0)
us = [set(rng.choice(np.arange(sink, n - recent), kk, replace=False).tolist()) for _ in range(nk)]
ujac = np.mean([len(a & b) / len(a | b) for i, a in enumerate(us) for b in us[i + 1:]])
uadj = np.mean([sum((p - 1 in s) or (p + 1 in s) for p in s) / len(s) for s in us])
print(f"pages {n}, top-k {kk} of {C}: heads' Jaccard {jac:.3f} (uniform {ujac:.3f}), adjacency {adj:.3f} (uniform {uadj:.3f})")
pos = top.float().mean(1) / n
print("mean relative position of picks per head:", [round(float(p), 2) for p in pos], "score std", float(scores.std()))
