"""none vs draft on the qwen2.5-coder pair, greedy, interleaved (warm-up, then 2 repeats): tokens/s, τ, identity."""
import statistics, sys, json
import specviz
from specviz import models
m = models.load("qwen2.5-coder")
prompt = "Write a Python function that returns the n-th Fibonacci number iteratively."
rows = {"none": [], "draft": []}
outs = {}
for rep in range(3):
    for drafter in (["none", "draft"] if rep % 2 == 0 else ["draft", "none"]):
        r = specviz.generate(prompt, models=m, drafter=drafter, max_new_tokens=48, k=4)
        if rep == 0:
            outs[drafter] = r.token_ids
            continue  # warm-up
        rows[drafter].append(r.stats)
        print(drafter, rep, f"{r.stats['tokens_per_s']:.2f} tok/s tau={r.stats['tau']:.2f}", file=sys.stderr, flush=True)
print(json.dumps({d: {"tokens_per_s_median": statistics.median(s["tokens_per_s"] for s in v),
                      "tau": v[0]["tau"], "acceptance_rate": v[0]["acceptance_rate"]} for d, v in rows.items()}
                 | {"outputs_equal": outs["none"] == outs["draft"], "text": r.text}, indent=1))
