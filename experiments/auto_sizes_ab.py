"""A/B of the "auto" tree budget's cost curve: interpolated from n = 1, 2, 4, 8, ... (`*_old`) or measured at every
n up to 8 (`*_new`: costs.AUTO_SIZES, what ships), for EAGLE-2 and Medusa, interleaved prompt by prompt, order rotated.

.venv/bin/python experiments/auto_sizes_ab.py 2,12,22,32,42,52,62,72   (MT-bench question indices)
"""
import json
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
from specviz import api, models
from specviz.decoding import engine
from specviz.decoding.costs import interpolate, verify_curve
from specviz.drafters import draft_vocabulary, make_drafter
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter
from specviz.settings import DecodeSettings

m = models.load("smollm2-135m")
curve = verify_curve(m)
print({n: round(v*1e3,1) for n, v in curve.items()})
old = interpolate({n: v for n, v in curve.items() if n in (1, 2, 4, 8, 16, 24, 32, 48, 64)})
new = interpolate(curve)
qs = [json.loads(l)["turns"][0] for l in open("../shared/data/mt_bench.jsonl")]
idx = [int(i) for i in sys.argv[1].split(",")]
def methods():
    v4096 = draft_vocabulary(m.eagle, 4096)
    return {
        "none": lambda: make_drafter("none", m),
        "eagle_old": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=m.eagle.draft_vocab, verify_cost=old),
        "eagle_new": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=m.eagle.draft_vocab, verify_cost=new),
        "eagle_new4096": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=v4096, verify_cost=new),
        "medusa_old": lambda: MedusaDrafter(m.medusa, m.target, draft_vocab=m.medusa.draft_vocab, total_tokens="auto", verify_cost=old),
        "medusa_new": lambda: MedusaDrafter(m.medusa, m.target, draft_vocab=m.medusa.draft_vocab, total_tokens="auto", verify_cost=new),
    }
M = methods()
names = list(M)
def run(q, name):
    ids = api.encode_prompt(m.tokenizer, q)
    settings = DecodeSettings(max_new_tokens=128)
    t = time.perf_counter(); d = None
    for e in engine.decode(m.target, m.tokenizer, M[name](), ids, settings, m.name, q, m.vocab_size): d = e
    return time.perf_counter() - t, d
for n in names: run(qs[0][:200], n)
res = {n: [] for n in names}; taus = {n: [] for n in names}; inputs = {n: [] for n in names}
for j, i in enumerate(idx):
    order = names[j % len(names):] + names[: j % len(names)]
    out = {}
    for n in order:
        t, d = run(qs[i], n); out[n] = (t, d)
    base_t, base = out["none"]
    for n in names:
        t, d = out[n]
        assert d.token_ids == base.token_ids, (n, i)
        res[n].append(base_t / t * len(d.token_ids) / len(base.token_ids)); taus[n].append(d.stats["tau"])
        inputs[n].append(d.stats["drafted"] / d.stats["steps"])
    print(i, {n: round(res[n][-1], 3) for n in names}, flush=True)
for n in names:
    print(f"{n:15s} speedup median {statistics.median(res[n]):.3f} (min {min(res[n]):.2f} max {max(res[n]):.2f}) tau {statistics.mean(taus[n]):.2f} nodes/step {statistics.mean(inputs[n]):.2f}")
