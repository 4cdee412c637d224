"""Per-position acceptance of our drafters in llama.cpp's llama-server and in specviz, on the same prompts at T = 0.

    .venv/bin/python experiments/llamacpp_parity.py [--limit 80] [--max-new-tokens 48] [--out docs/results/llamacpp-parity.md]

Exports the EAGLE-3 head and the draft model as GGUF (specviz.llamacpp.export), encodes the MT-bench questions once
(chat template) and gives the same token ids to both engines, both on the target's own GGUF:
* EAGLE-3 as a chain of depth 3: llama-server `--spec-type draft-eagle3 --spec-draft-n-max 3`; specviz `eagle3`
  with depth=3, top_k=1, total_tokens=3 (a tree of one branch is a chain).
* the draft model, K = 4: llama-server `--spec-type draft-simple --spec-draft-n-max 4`; specviz `draft` with k=4 over
  the whole vocabulary (draft_vocab=full), as llama.cpp drafts.
llama-server drafts every step it can (`--spec-draft-n-min 0`, `--spec-draft-p-min 0`), greedy at T = 0.
Acceptance at position i = drafts whose token i was accepted / drafts: llama-server's counters (/metrics,
`spec_decode_num_accepted_tokens_per_pos_total{position=i}` over `spec_decode_num_drafts_total`, read before and
after the run, as they count over the server's life); ours, the same count over steps that drafted, from the first
answer token on as llama.cpp counts (run_ours says why; the table gives specviz's own count beside it).
specviz runs the target from the same GGUF blocks on 8-bit activations (`weights="q4q8"`, llama.cpp's scheme) and
the drafters in fp32 (SPECVIZ_DRAFT_DTYPE=float32), as the exported f32 GGUFs run in llama.cpp. Each engine commits
its target's greedy tokens; where the two differ at a near-tie (their activations round to 8 bits and sum in their
own order) the texts part from there on, and the table says for how many prompts that happened.

    .venv/bin/python experiments/llamacpp_parity.py --forced 2 [--limit 8] [--out ...]

drafts on the same text in both engines instead (what tests/test_llamacpp_export.py checks): each prompt followed by
the first j tokens of the target's greedy answer (j = 0, 2, 4, ...), one drafting step after each, and compares the
two engines context by context: on how many they accepted the same number of drafted tokens, and per position the
contexts where only one of them accepted it (McNemar's exact test on those).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"

# (label, exported file, llama-server --spec-type, specviz drafter, its options, tokens per draft); specviz runs
# them at k_policy=fixed, as llama.cpp drafts its full length every step
RUNS = [
    ("EAGLE-3 chain, depth 3", "eagle3", "draft-eagle3", "eagle3",
     {"depth": 3, "top_k": 1, "total_tokens": 3}, 3),
    ("draft model, K = 4", "draft", "draft-simple", "draft", {"draft_vocab": "full"}, 4),
]
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
PER_POSITION = re.compile(r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}\s+(\S+)$')


def encode(limit: int, tokenizer) -> list[dict]:
    from specviz.api import encode_prompt
    from specviz.bench.prompts import load_prompts

    return [{"id": p.id, "prompt_ids": encode_prompt(tokenizer, p.text)} for p in load_prompts(MT_BENCH, limit=limit)]


def counters(url: str) -> tuple[int, list[int]]:
    """(drafts, accepted tokens per position) from llama-server's /metrics, cumulative over its life."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    drafts, per_position = 0, {}
    for line in text.splitlines():
        if line.startswith(DRAFTS + " "):
            drafts = int(float(line.split()[-1]))
        elif match := PER_POSITION.match(line):
            per_position[int(match.group(1))] = int(float(match.group(2)))
    return drafts, [per_position.get(i, 0) for i in range(len(per_position))]


def run_llama(binary: Path, files: dict, spec_type: str, draft: str, k: int, prompts: list[dict], max_new: int,
              threads: int) -> dict:
    """llama-server over the target's GGUF with one exported drafter: per-position acceptance and the outputs."""
    from specviz.llamacpp.server import LlamaServer

    started = time.perf_counter()
    with LlamaServer(binary, files["target"], spec_type=spec_type, draft=files[draft], draft_max=k, draft_min=0,
                     p_min=0.0, threads=threads, ctx=4096) as server:
        drafts0, accepted0 = counters(server.url)
        outputs = []
        for n, p in enumerate(prompts, 1):
            print(f"llama.cpp {spec_type}: prompt {n}/{len(prompts)}", file=sys.stderr, flush=True)
            answer = server.complete(p["prompt_ids"], max_tokens=max_new)
            outputs.append({"id": p["id"], "token_ids": list(answer.get("tokens", []))})
        drafts1, accepted1 = counters(server.url)
    accepted0 += [0] * (len(accepted1) - len(accepted0))
    drafts, accepted = drafts1 - drafts0, [b - a for a, b in zip(accepted0, accepted1)]
    return {"drafts": drafts, "accepted_per_pos": accepted,
            "per_position_acceptance": [a / drafts for a in accepted] if drafts else [],
            "decode_s": round(time.perf_counter() - started, 1), "outputs": outputs}


def run_ours(models, prompts: list[dict], drafter: str, options: dict, k: int, max_new: int) -> dict:
    """specviz on the same prompt ids: per-position acceptance over steps that drafted, and the outputs.

    Counted two ways. "every step" is specviz's own count. "from the first token on" leaves out each prompt's first
    step, as llama.cpp counts: specviz's prefill caches the prompt but its last token, and the first step drafts
    from the prompt and verifies the first answer token with the drafts; llama.cpp's prompt pass samples the first
    token itself and drafts only after it, so that step is neither drafted nor counted there."""
    from specviz.decoding import engine
    from specviz.decoding.settings import DecodeSettings
    from specviz.drafters import make_drafter

    settings = DecodeSettings(max_new_tokens=max_new, temperature=0.0, k=k, n_top=0)
    every, later = [0] * k, [0] * k  # accepted tokens per position: every step, from the first token on
    drafts = first_drafts = 0
    outputs = []
    started = time.perf_counter()
    for n, p in enumerate(prompts, 1):
        print(f"specviz {drafter}: prompt {n}/{len(prompts)}", file=sys.stderr, flush=True)
        the_drafter = make_drafter(drafter, models, k=k, options={"k_policy": "fixed", **options})
        events = list(engine.decode(models.target, models.tokenizer, the_drafter, p["prompt_ids"], settings,
                                    models.name, "", models.vocab_size))
        stats, first = events[-1].stats, next(e for e in events if e.type == "step")
        drafts += stats["reached"][0] if stats["reached"] else 0
        first_drafts += 1 if first.drafted else 0
        for i, a in enumerate(stats["accepted_at"][:k]):
            every[i] += a
            later[i] += a - (1 if i < (first.accepted or 0) else 0)
        outputs.append({"id": p["id"], "token_ids": list(events[-1].token_ids)})
    later_drafts = drafts - first_drafts
    return {"drafts": later_drafts, "accepted_per_pos": later,
            "per_position_acceptance": [a / later_drafts for a in later] if later_drafts else [],
            "every_step": {"drafts": drafts, "accepted_per_pos": every,
                           "per_position_acceptance": [a / drafts for a in every] if drafts else []},
            "decode_s": round(time.perf_counter() - started, 1), "outputs": outputs}


ACCEPTED_LINE = re.compile(r"accepted\s+(\d+)\s*/\s*(\d+) draft tokens")


def forced_contexts(prompts: list[dict], texts: list[list[int]], stride: int) -> list[list[int]]:
    """The same committed text for both engines: each prompt followed by the first j + 1 tokens of its reference
    answer, for j = 0, stride, 2 stride, ... (the contexts a drafter drafts after, whatever each engine would
    commit)."""
    return [p["prompt_ids"] + text[: j + 1] for p, text in zip(prompts, texts) for j in range(0, len(text) - 1, stride)]


def forced_llama(binary: Path, files: dict, spec_type: str, draft: str, k: int, contexts: list[list[int]],
                 threads: int) -> list[tuple[int, int] | None]:
    """llama-server's first drafting step after each context: (accepted, drafted), None where it drafted nothing.

    llama-server is given the context but its last token, samples that token from its prompt pass (the target's
    greedy token: the reference text's, but where the two targets part at a near-tie), then drafts after it, as
    specviz's first step drafts after its whole prompt (forced_ours). That step is read from
    its log ("accepted A/N draft tokens", one line per verify step where LLAMA_TRACE is set), the first such line
    each request writes."""
    from specviz.llamacpp.server import LlamaServer

    steps: list[tuple[int, int] | None] = []
    server = LlamaServer(binary, files["target"], spec_type=spec_type, draft=files[draft], draft_max=k, draft_min=0,
                         p_min=0.0, threads=threads, ctx=4096)
    before = os.environ.get("LLAMA_TRACE")
    os.environ["LLAMA_TRACE"] = "1"  # the server inherits it
    try:
        server.start()
    finally:
        if before is None:
            del os.environ["LLAMA_TRACE"]
        else:
            os.environ["LLAMA_TRACE"] = before
    try:  # started once here: entering `with server` would start a second process
        for n, ids in enumerate(contexts, 1):
            if n % 16 == 1:
                print(f"llama.cpp {spec_type}: context {n}/{len(contexts)}", file=sys.stderr, flush=True)
            start = server.log.stat().st_size
            server.complete(ids[:-1], max_tokens=k + 2)  # the sampled token, then one draft of k and its bonus
            with server.log.open("rb") as log:
                log.seek(start)
                found = ACCEPTED_LINE.search(log.read().decode(errors="replace"))
            steps.append((int(found.group(1)), int(found.group(2))) if found else None)
    finally:
        server.stop()
    return steps


def forced_ours(models, drafter: str, options: dict, k: int, contexts: list[list[int]]) -> list[tuple[int, int] | None]:
    """specviz's first step after each context, the whole context as the prompt: its prefill caches all but the last
    token, and the step drafts after the context and verifies the drafts, as llama-server's first drafting step
    (forced_llama). (accepted, drafted), None where it drafted nothing."""
    from specviz.decoding import engine
    from specviz.decoding.settings import DecodeSettings
    from specviz.drafters import make_drafter

    settings = DecodeSettings(max_new_tokens=k + 1, temperature=0.0, k=k, n_top=0)
    steps: list[tuple[int, int] | None] = []
    for n, ids in enumerate(contexts, 1):
        if n % 16 == 1:
            print(f"specviz {drafter}: context {n}/{len(contexts)}", file=sys.stderr, flush=True)
        the_drafter = make_drafter(drafter, models, k=k, options={"k_policy": "fixed", **options})  # one per run
        run = engine.decode(models.target, models.tokenizer, the_drafter, ids, settings, models.name, "",
                            models.vocab_size)
        first = next(e for e in run if e.type == "step")
        run.close()
        steps.append((first.accepted or 0, first.drafted) if first.drafted else None)
    return steps


def reference_texts(models, prompts: list[dict], max_new: int) -> list[list[int]]:
    """The target's own greedy answer to each prompt (plain decoding in specviz), the text both engines draft on."""
    from specviz.decoding import engine
    from specviz.decoding.settings import DecodeSettings
    from specviz.drafters import make_drafter

    settings = DecodeSettings(max_new_tokens=max_new, temperature=0.0, n_top=0)
    texts = []
    for p in prompts:
        events = list(engine.decode(models.target, models.tokenizer, make_drafter("none", models), p["prompt_ids"],
                                    settings, models.name, "", models.vocab_size))
        texts.append(list(events[-1].token_ids))
    return texts


def paired(theirs: list[tuple[int, int] | None], ours: list[tuple[int, int] | None], k: int) -> dict:
    """Both engines' steps on the same contexts: per-position acceptance of each over the contexts where both drafted
    k tokens, the contexts where they accepted the same number, and per position the discordant pairs (llama.cpp
    accepted it and specviz did not, and the reverse) with McNemar's exact two-sided p-value on them."""
    from scipy.stats import binomtest

    both = [(a[0], b[0]) for a, b in zip(theirs, ours) if a and b and a[1] == k and b[1] == k]
    n = len(both)
    per_position = {"llama": [sum(a > i for a, _ in both) / n if n else 0.0 for i in range(k)],
                    "ours": [sum(b > i for _, b in both) / n if n else 0.0 for i in range(k)]}
    discordant = [(sum(a > i >= b for a, b in both), sum(b > i >= a for a, b in both)) for i in range(k)]
    p_values = [binomtest(x, x + y).pvalue if x + y else 1.0 for x, y in discordant]
    return {"contexts": len(theirs), "compared": n, "same": sum(a == b for a, b in both),
            "llama_drafted": sum(1 for a in theirs if a), "per_position": per_position, "discordant": discordant,
            "p_values": p_values}


def draft_alone(binary: Path, files: dict, models, prompts: list[dict], max_new: int) -> dict:
    """The exported draft as llama-server's only model against specviz's draft model, both greedy: which prompts
    give the same tokens (no target between them: this compares the two drafts' arithmetic alone)."""
    import torch

    from specviz.llamacpp.server import LlamaServer

    with LlamaServer(binary, files["draft"], threads=2, ctx=4096) as server:
        theirs = [{"id": p["id"], "token_ids": server.complete(p["prompt_ids"], max_tokens=max_new)["tokens"]}
                  for p in prompts]
    end, ours = models.tokenizer.eos_token_id, []
    for p in prompts:
        with torch.inference_mode():
            out = models.draft.generate(torch.tensor([p["prompt_ids"]]), max_new_tokens=max_new, do_sample=False,
                                        eos_token_id=end, pad_token_id=end)
        ours.append({"id": p["id"], "token_ids": out[0, len(p["prompt_ids"]):].tolist()})
    return compare_outputs(theirs, ours, end)


def load_ours():
    """The target from its GGUF blocks on 8-bit activations, the drafters in fp32 (see the module's docstring)."""
    os.environ.setdefault("SPECVIZ_DRAFT_DTYPE", "float32")  # before specviz loads the drafters
    from specviz import models

    loaded = models.load("smollm2-135m", device="cpu", weights="q4q8")
    if loaded.weights != "q4q8":  # without specviz's C++ ops the target falls back to fp32 weights
        raise SystemExit(f"the target loaded with {loaded.weights} weights, not q4q8: build specviz's C++ ops first")
    return loaded


def without_end(ids: list[int], end: int) -> list[int]:
    """Token ids without a final end-of-sequence token (one engine returns it, the other may not)."""
    return ids[:-1] if ids and ids[-1] == end else ids


def compare_outputs(theirs: list[dict], ours: list[dict], end: int) -> dict:
    """How many prompts committed identical tokens, and for the others where they part (the first differing index)."""
    same, parted = 0, []
    for a, b in zip(theirs, ours):
        x, y = without_end(a["token_ids"], end), without_end(b["token_ids"], end)
        if x == y:
            same += 1
        else:
            at = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            parted.append({"id": a["id"], "at": at})
    return {"same": same, "parted": parted}


def parted_summary(parted: list[dict]) -> str:
    """Where the outputs that differ part: how many, the median first differing token, how many at the first."""
    at = sorted(p["at"] for p in parted)
    first = sum(a == 0 for a in at)
    return (f"{len(at)} part, at token {at[len(at) // 2]} (median; {at[0]} to {at[-1]})"
            + (f"; {first} at the very first token" if first else ""))


def max_difference(a: list[float], b: list[float], n: int) -> float:
    a, b = list(a) + [0.0] * n, list(b) + [0.0] * n
    return max(abs(x - y) for x, y in zip(a[:n], b[:n])) if n else 0.0


def fmt(values: list[float], n: int) -> str:
    values = list(values) + [0.0] * (n - len(values))
    return " / ".join(f"{v:.3f}" for v in values[:n])


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def report(rows: list[dict], args, n_prompts: int, alone: dict | None = None) -> str:
    command = "python experiments/llamacpp_parity.py " + " ".join(sys.argv[1:])
    lines = [
        f"## {n_prompts} MT-bench questions, at most {args.max_new_tokens} new tokens",
        "",
        f"{n_prompts} MT-bench questions (first turn, chat template), at most {args.max_new_tokens} new tokens, T = 0; "
        "the target from its Q4_1 GGUF on 8-bit activations in both engines (specviz `weights=\"q4q8\"`), the "
        "drafters in f32 (the export's default; specviz with SPECVIZ_DRAFT_DTYPE=float32). Acceptance at position "
        "i = drafts whose token i was accepted / drafts.",
        "",
        f"- Command: `{command}`",
        f"- Machine: {machine()}; llama.cpp: llama-server build 11434 (`make llamacpp`), {args.threads} thread(s)",
        f"- Date: {datetime.date.today().isoformat()}",
        "",
        "| drafter | engine | drafts | accepted tokens | per position | max difference | same output | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        n, theirs, ours = row["tokens"], row["llama"], row["ours"]
        lines.append(f"| {row['label']} | llama.cpp | {theirs['drafts']} | {sum(theirs['accepted_per_pos'])} | "
                     f"{fmt(theirs['per_position_acceptance'], n)} | {row['max_difference']:.3f} | "
                     f"{row['same']}/{n_prompts} | {theirs['decode_s']} |")
        lines.append(f"| {row['label']} | specviz, from the first token on | {ours['drafts']} | "
                     f"{sum(ours['accepted_per_pos'])} | {fmt(ours['per_position_acceptance'], n)} | | | "
                     f"{ours['decode_s']} |")
        every = ours["every_step"]
        lines.append(f"| {row['label']} | specviz, every step | {every['drafts']} | {sum(every['accepted_per_pos'])} | "
                     f"{fmt(every['per_position_acceptance'], n)} | {row['max_difference_every']:.3f} | | |")
    lines += ["", "specviz, from the first token on: counted as llama.cpp counts, leaving out each prompt's first "
              "step, which drafts from the prompt and verifies the first answer token (llama.cpp samples that token "
              "from its prompt pass and drafts only after it); every step: specviz's own count. Max difference: "
              "against llama.cpp, at the worst position. Same output: prompts whose committed tokens are identical "
              "in both engines (each commits its own target's greedy tokens; where they part, the drafts after "
              "that point are on different text)."]
    for row in rows:
        if row["parted"]:
            lines.append(f"{row['label']}: {parted_summary(row['parted'])}.")
    if alone is not None:
        n = alone["same"] + len(alone["parted"])
        where = f" ({parted_summary(alone['parted'])})" if alone["parted"] else ""
        lines += ["", f"The exported draft as llama-server's only model against specviz's draft model, both greedy on "
                  f"the first {n} of these prompts, at most {args.max_new_tokens} new tokens (no target between them: "
                  f"the two drafts' arithmetic alone): the same tokens on {alone['same']} of {n}{where}."]
    return "\n".join(lines) + "\n"


def forced_report(args, binary: Path, files: dict, models, prompts: list[dict]) -> int:
    """--forced: both engines draft on the same contexts; the paired table (see the module's docstring)."""
    contexts = forced_contexts(prompts, reference_texts(models, prompts, args.max_new_tokens), args.forced)
    command = "python experiments/llamacpp_parity.py " + " ".join(sys.argv[1:])
    lines = [f"## The same text in both engines: {len(prompts)} MT-bench questions, a context every {args.forced} "
             f"answer tokens", "",
             f"- Command: `{command}`", f"- Machine: {machine()}; llama-server build 11434, {args.threads} thread(s)",
             f"- Date: {datetime.date.today().isoformat()}", "",
             "| drafter | contexts | both drafted K | same accepted count | llama.cpp, per position | specviz, per "
             "position | only llama.cpp / only specviz, per position | McNemar p, smallest |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, draft, spec_type, drafter, options, k in RUNS:
        if args.only and args.only != draft:
            continue
        result = paired(forced_llama(binary, files, spec_type, draft, k, contexts, args.threads),
                        forced_ours(models, drafter, options, k, contexts), k)
        n = result["compared"]
        lines.append(f"| {label} | {result['contexts']} | {n} | {result['same']} ({result['same'] / max(n, 1):.2f}) | "
                     f"{fmt(result['per_position']['llama'], k)} | {fmt(result['per_position']['ours'], k)} | "
                     + " · ".join(f"{x}/{y}" for x, y in result["discordant"])
                     + f" | {min(result['p_values']):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.write_text((out.read_text() if out.exists() else "") + "\n" + text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8, help="the first N MT-bench questions (80: all)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    parser.add_argument("--work", default=str(ROOT / "runs" / "llamacpp-parity"), help="export and raw results go here")
    parser.add_argument("--out", default=None, help="add the markdown table to this file (docs/results/llamacpp-parity.md)")
    parser.add_argument("--only", choices=[run[1] for run in RUNS], default=None)
    parser.add_argument("--forced", type=int, default=0, metavar="STRIDE",
                        help="draft on the same text in both engines, a context every STRIDE answer tokens (0: no)")
    parser.add_argument("--draft-alone", type=int, default=10,
                        help="with the draft model: also decode the first N prompts with the draft alone in both (0: no)")
    args = parser.parse_args(argv)

    from specviz.llamacpp.build import installed
    from specviz.llamacpp.export import export_all

    binary = installed()
    if binary is None:
        raise SystemExit("no llama-server: run `make llamacpp` first (or set SPECVIZ_LLAMA_SERVER)")
    work = Path(args.work)
    files = export_all(work / "export")
    models = load_ours()
    prompts = encode(args.limit, models.tokenizer)
    end = models.tokenizer.eos_token_id
    if args.forced:
        return forced_report(args, binary, files, models, prompts)
    rows = []
    for label, draft, spec_type, drafter, options, k in RUNS:
        if args.only and args.only != draft:
            continue
        theirs = run_llama(binary, files, spec_type, draft, k, prompts, args.max_new_tokens, args.threads)
        ours = run_ours(models, prompts, drafter, options, k, args.max_new_tokens)
        (work / f"llama-{draft}.json").write_text(json.dumps(theirs))
        (work / f"ours-{draft}.json").write_text(json.dumps(ours))
        compared = compare_outputs(theirs["outputs"], ours["outputs"], end)
        rows.append({"label": label, "tokens": k, "llama": theirs, "ours": ours, **compared,
                     "max_difference": max_difference(theirs["per_position_acceptance"],
                                                      ours["per_position_acceptance"], k),
                     "max_difference_every": max_difference(theirs["per_position_acceptance"],
                                                            ours["every_step"]["per_position_acceptance"], k)})
        print(label, "llama.cpp", fmt(theirs["per_position_acceptance"], k), "specviz",
              fmt(ours["per_position_acceptance"], k), "same", compared["same"], flush=True)
    alone = None
    if args.draft_alone and args.only in (None, "draft"):
        alone = draft_alone(binary, files, models, prompts[: args.draft_alone], args.max_new_tokens)
    text = report(rows, args, len(prompts), alone)
    print(text)
    if args.out:
        out = Path(args.out)
        before = out.read_text() if out.exists() else ("# Our drafters in llama.cpp and in specviz: per-position "
                                                       "acceptance\n")
        out.write_text(before + "\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
