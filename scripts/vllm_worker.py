"""Decode token-id prompts with vLLM and report its speculative-decoding counters, as JSON.

Runs in vLLM's own venv (`make vllm`), with nothing of specviz imported:

    .venv-vllm/bin/python scripts/vllm_worker.py --target DIR [--method eagle3 --spec-model DIR --tokens 3]
        --prompts PROMPTS.json --max-tokens 96 --out RESULT.json

PROMPTS.json: [{"id": ..., "prompt_ids": [...]}, ...] (the ids specviz encoded, chat template applied), so that both
engines start from the same tokens. RESULT.json: each prompt's output ids, vLLM's counters
(`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`), per-position acceptance (accepted at position i / drafts), and how long vLLM
took to start and to decode. T = 0, fp32, eager (no graph capture: on a CPU it only adds start-up time).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# vLLM's KV cache on a CPU host is VLLM_CPU_KVCACHE_SPACE GiB, taken whole at start-up; 1 GiB holds about 23,000
# tokens of this 30-layer, 3-KV-head target in fp32 (30 layers x 2 x 192 x 4 bytes = 46 KB a token)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is a local folder; never reach a hub


def speculative_config(method: str, spec_model: str | None, tokens: int) -> dict | None:
    if method == "none":
        return None
    config = {"method": method, "num_speculative_tokens": tokens}
    if method == "ngram":
        config.update(prompt_lookup_max=3, prompt_lookup_min=2)
    elif spec_model:
        config["model"] = spec_model
    return config


def counters(metrics) -> dict:
    """vLLM's spec_decode counters by name (the per-position one is a vector)."""
    found = {}
    for metric in metrics:
        if metric.name.startswith("vllm:spec_decode"):
            value = getattr(metric, "values", None)
            found[metric.name] = list(value) if value is not None else metric.value
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--method", default="none", choices=["none", "ngram", "draft_model", "eagle3"])
    parser.add_argument("--spec-model", default=None)
    parser.add_argument("--tokens", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.load(open(args.prompts))
    started = time.perf_counter()
    llm = LLM(model=args.target, dtype="float32", enforce_eager=True, max_model_len=args.max_model_len, seed=0,
              speculative_config=speculative_config(args.method, args.spec_model, args.tokens),
              disable_log_stats=False)
    startup_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in prompts], params, use_tqdm=False)
    decode_s = time.perf_counter() - started
    found = counters(llm.get_metrics())
    drafts = found.get("vllm:spec_decode_num_drafts", 0)
    per_pos = found.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    result = {
        "method": args.method, "spec_model": args.spec_model, "tokens": args.tokens, "max_tokens": args.max_tokens,
        "startup_s": round(startup_s, 1), "decode_s": round(decode_s, 2),
        "new_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "counters": found,
        "per_position_acceptance": [a / drafts for a in per_pos] if drafts else [],
        "outputs": [{"id": p["id"], "token_ids": list(o.outputs[0].token_ids)} for p, o in zip(prompts, outputs)],
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps({k: v for k, v in result.items() if k != "outputs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
