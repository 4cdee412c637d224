"""The GGUF's 4-bit weights with fp32 activations (`--weights q4`) against the same weights on 8-bit activations
multiplied in integers (`weights="q4q8"`, specviz/kernels/csrc/intdot.h), side by side in one process.

1. speed (`--speed`): the products alone over 1–16 rows (576 → 1536 and 1536 → 576 in Q4_1, the 576 → 49152
   LM head in Q8_0, random blocks), then one target forward over 1, 2, 4, 8 new tokens after 256 cached, the two
   ways alternated (order flipped every round), medians after a warm-up round; each ratio from 3 separate runs (the
   median ratio, and the times of the run that gave it); and each way's 8-token forward over its own 1-token one;
2. greedy agreement (`--agreement`): greedy outputs of both on every question's first turn (the bench's
   prompts), equal or not; where they part, the position and the fp32-activation target's top-1 minus top-2
   logit there;
3. drift (`--kl`): the mean KL(p_q4 ‖ p_q4q8) of the next-token distributions, and how often their top-1 tokens
   agree, at the first N response positions of the held-out training prompts (the first 128 of
   `specviz train data`'s shuffled order, never trained on), each answered greedily by the q4 target; and the same
   with only the projections, or only the LM head, on 8-bit activations (the other part on fp32 ones);
4. with `--llama-cpp` (llama-cpp-python importable, e.g. built by `make peers`), llama.cpp's own drift on the same
   GGUF, whose dot products quantize the activations to 8 bits too: its greedy output against the q4 target's,
   and KL(p_q4 ‖ p_llama.cpp) at the same positions (its logits for every position, over the same tokens).

    .venv/bin/python experiments/q8act_ab.py --speed [--rounds 9] [--threads 2]
    .venv/bin/python experiments/q8act_ab.py --agreement --questions ../shared/data/mt_bench.jsonl --tokens 128
    .venv/bin/python experiments/q8act_ab.py --kl --positions 1000 [--llama-cpp]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from q4_weights_ab import greedy, margin_at, spread

from specviz import api, models
from specviz.decoding import engine
from specviz.decoding.target import Target
from specviz.kernels import quant
from specviz.kernels.kvcache import crop_cache

WAYS = ("q4", "q4q8")


def products(rounds: int) -> list[str]:
    lines = ["| product | rows | q4 (ms) | q4q8 (ms) | q4 ÷ q4q8 |", "|---|---|---|---|---|"]
    generator = torch.Generator().manual_seed(0)
    for out, inp, bits in ((1536, 576, 4), (576, 1536, 4), (49152, 576, 8)):
        if bits == 4:
            linear = quant.Q4Linear(torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8),
                                    torch.rand(out, inp // 32, generator=generator) * 0.01,
                                    -torch.rand(out, inp // 32, generator=generator) * 0.1)
        else:
            linear = quant.Q8Linear(torch.randint(-127, 128, (out, inp), generator=generator, dtype=torch.int8),
                                    torch.rand(out, inp // 32, generator=generator) * 0.01)
        ways = {"q4": linear, "q4q8": quant.with_8_bit_activations(linear)}
        for rows in (1, 2, 4, 8, 16):
            x = torch.randn(rows, inp, generator=generator)
            runs = spread({way: (lambda m=m, x=x: m(x)) for way, m in ways.items()}, rounds * 4)
            ratios = [r["q4"] / r["q4q8"] for r in runs]
            middle = runs[ratios.index(statistics.median(ratios))]
            lines.append(f"| {inp} → {out}, Q{bits} | {rows} | {1e3 * middle['q4']:.3f} | {1e3 * middle['q4q8']:.3f} | "
                         f"{statistics.median(ratios):.2f}× |")
    return lines


def forwards(targets: dict, rounds: int, context_len: int) -> list[str]:
    vocab = targets["q4"].model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(vocab, (context_len,), generator=generator).tolist()
    caches = {}
    for way, target in targets.items():
        caches[way] = target.new_cache()
        target.forward(context, caches[way], logits=False)
    lines = [f"| forward after {context_len} cached | q4 (ms) | q4q8 (ms) | q4 ÷ q4q8 |", "|---|---|---|---|"]
    times = {}
    for n in (1, 2, 4, 8):
        ids = torch.randint(vocab, (n,), generator=generator).tolist()

        def call(way, ids=ids):
            targets[way].forward(ids, caches[way])
            crop_cache(caches[way], context_len)

        runs = spread({way: (lambda way=way: call(way)) for way in WAYS}, rounds)
        ratios = [r["q4"] / r["q4q8"] for r in runs]
        middle = runs[ratios.index(statistics.median(ratios))]
        times[n] = middle
        lines.append(f"| {n} new tokens | {1e3 * middle['q4']:.1f} | {1e3 * middle['q4q8']:.1f} | "
                     f"{statistics.median(ratios):.2f}× (runs: {', '.join(f'{r:.2f}' for r in ratios)}) |")
    lines += ["", "| | q4 | q4q8 |", "|---|---|---|"]
    for n in (2, 4, 8):
        lines.append(f"| {n} tokens ÷ 1 token | {times[n]['q4'] / times[1]['q4']:.2f}× | "
                     f"{times[n]['q4q8'] / times[1]['q4q8']:.2f}× |")
    return lines


def agreement(loaded: dict, targets: dict, prompts: list[str], tokens: int) -> list[str]:
    lines = [f"| prompt | greedy {tokens} tokens, q4q8 against q4 |", "|---|---|"]
    equal, parts = 0, []
    for prompt in prompts:
        ids = api.encode_prompt(loaded["q4"].tokenizer, prompt)
        got = {way: greedy(loaded[way], ids, tokens).token_ids for way in WAYS}
        if got["q4"] == got["q4q8"]:
            equal += 1
            lines.append(f"| {prompt[:48]!r} | equal ({len(got['q4'])} tokens) |")
            continue
        first = next((i for i, (a, b) in enumerate(zip(got["q4"], got["q4q8"])) if a != b),
                     min(len(got["q4"]), len(got["q4q8"])))
        margin = margin_at(targets["q4"], ids + got["q4"][:first])
        parts.append((first, margin))
        lines.append(f"| {prompt[:48]!r} | part at token {first}: q4's top-1 minus top-2 logit there {margin:.4f} |")
    summary = f"equal on {equal} of {len(prompts)}"
    if parts:
        firsts, margins = [p[0] for p in parts], [p[1] for p in parts]
        summary += (f"; where they part, at token {min(firsts)}–{max(firsts)} (median {statistics.median(firsts)}), "
                    f"q4's margin there {min(margins):.4f}–{max(margins):.4f} (median {statistics.median(margins):.4f})")
    return lines + ["", summary]


def held_out_sequences(loaded, positions: int, tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the q4 target's greedy answer) for the held-out prompts, until `positions` answer tokens."""
    from specviz.train.data import DataConfig, select_prompts

    held_out, _ = select_prompts(DataConfig(n_prompts=0), loaded.tokenizer)
    sequences, total = [], 0
    for ids in held_out:
        answer = greedy(loaded, ids, tokens).token_ids
        sequences.append((ids, answer))
        total += len(answer)
        if total >= positions:
            break
    return sequences


def distributions(target: Target, ids: list[int], answer: list[int]) -> torch.Tensor:
    """log p of the next token at each answer position (the positions predicting answer[0], answer[1], ...)."""
    _, logits = target.forward(ids + answer, target.new_cache())
    return torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(answer)].double(), dim=-1)


def llama_cpp_distributions(llm, ids: list[int], answer: list[int]) -> torch.Tensor:
    import numpy as np

    llm.reset()
    llm.eval(ids + answer)
    scores = np.array(llm.scores[: len(ids) + len(answer)])  # (positions, vocab): logits_all
    return torch.log_softmax(torch.from_numpy(scores[len(ids) - 1 : len(ids) - 1 + len(answer)]).double(), dim=-1)


def drift(reference: list[torch.Tensor], other: list[torch.Tensor], positions: int) -> str:
    p, q = torch.cat(reference)[:positions], torch.cat(other)[:positions]
    kl = (p.exp() * (p - q)).sum(-1)
    top1 = (p.argmax(-1) == q.argmax(-1)).double().mean()
    return (f"mean KL {kl.mean():.5f} (median {kl.median():.5f}, max {kl.max():.4f}) over {len(kl)} positions; "
            f"top-1 agreement {top1:.4f}")


def kl_part(loaded: dict, targets: dict, positions: int, tokens: int, llama_cpp: bool) -> list[str]:
    sequences = held_out_sequences(loaded["q4"], positions, tokens)
    logp = {way: [distributions(targets[way], ids, answer) for ids, answer in sequences] for way in WAYS}
    lines = [f"held-out positions: {sum(len(a) for _, a in sequences)} answer tokens of {len(sequences)} prompts, "
             f"the first {positions} used",
             f"q4q8 against q4: {drift(logp['q4'], logp['q4q8'], positions)}"]
    heads = {way: quant.q8_head(loaded[way].target) for way in WAYS}
    for label, way, head in (("projections on 8-bit activations, LM head on fp32 ones", "q4q8", heads["q4"]),
                             ("projections on fp32 activations, LM head on 8-bit ones", "q4", heads["q4q8"])):
        mixed = Target(loaded[way].target)
        mixed.head = head  # the other way's LM head, on this adapter only
        lines.append(f"{label}: {drift(logp['q4'], [distributions(mixed, i, a) for i, a in sequences], positions)}")
    if llama_cpp:
        llm = llama_cpp_model(loaded["q4"], max(len(i) + len(a) for i, a in sequences) + 8, logits_all=True)
        theirs = [llama_cpp_distributions(llm, ids, answer) for ids, answer in sequences]
        lines.append(f"llama.cpp against q4: {drift(logp['q4'], theirs, positions)}")
        lines.append(f"llama.cpp against q4q8: {drift(logp['q4q8'], theirs, positions)}")
    return lines


def llama_cpp_model(loaded, n_ctx: int, logits_all: bool = False):
    import llama_cpp

    from specviz.bench.llamacpp import gguf_of

    gguf, why = gguf_of(loaded)
    assert gguf is not None, why
    threads = torch.get_num_threads()
    return llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                           n_threads_batch=threads, logits_all=logits_all, verbose=False)


def llama_cpp_agreement(loaded: dict, prompts: list[str], tokens: int) -> list[str]:
    """llama.cpp's greedy output against the q4 target's (and the q4q8 one's), on the same prompt tokens."""
    llm = llama_cpp_model(loaded["q4"], 2048)
    eos = engine.eos_ids(loaded["q4"].target, loaded["q4"].tokenizer)
    equal = {way: 0 for way in WAYS}
    for prompt in prompts:
        ids = api.encode_prompt(loaded["q4"].tokenizer, prompt)
        ours = {way: greedy(loaded[way], ids, tokens).token_ids for way in WAYS}
        llm.reset()
        theirs = []
        for token in llm.generate(ids, reset=True, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            theirs.append(int(token))
            if len(theirs) >= tokens or theirs[-1] in eos:
                break
        for way in WAYS:
            equal[way] += theirs == ours[way]
    return [f"llama.cpp's greedy output equals q4's on {equal['q4']} of {len(prompts)}, q4q8's on "
            f"{equal['q4q8']} of {len(prompts)}"]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--agreement", action="store_true")
    ap.add_argument("--kl", action="store_true")
    ap.add_argument("--llama-cpp", action="store_true", help="llama.cpp's own drift beside ours (--agreement, --kl)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--questions", default="../shared/data/mt_bench.jsonl")
    ap.add_argument("--limit", type=int, help="the first N questions only")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--positions", type=int, default=1000)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    assert quant.available(), "specviz's C++ ops are not built here"
    loaded = {way: models.load(args.model, device="cpu", weights=way) for way in WAYS}
    assert [loaded[way].weights for way in WAYS] == list(WAYS) and quant.activations(loaded["q4q8"].target) == "q8"
    targets = {way: Target(loaded[way].target) for way in WAYS}
    paths = {0: "portable", 1: "AVX2", 2: "AVX-512"}
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads, fp32-activation path "
          f"{paths[torch.ops.specviz.q4_path(-1)]}, 8-bit-activation path {paths[torch.ops.specviz.q8act_path(-1)]}",
          flush=True)
    if args.speed:
        print(f"\nmedians of {args.rounds} alternated rounds after a warm-up (products: {4 * args.rounds}), 3 runs\n",
              flush=True)
        print("\n".join(products(args.rounds)) + "\n", flush=True)
        print("\n".join(forwards(targets, args.rounds, args.context_len)), flush=True)
    if args.agreement or (args.llama_cpp and not args.kl):
        lines = Path(args.questions).read_text().splitlines()
        prompts = [json.loads(line)["turns"][0] for line in lines if line.strip()][: args.limit]
        if args.agreement:
            print("\n" + "\n".join(agreement(loaded, targets, prompts, args.tokens)), flush=True)
        if args.llama_cpp:
            print("\n" + "\n".join(llama_cpp_agreement(loaded, prompts, args.tokens)), flush=True)
    if args.kl:
        print("\n" + "\n".join(kl_part(loaded, targets, args.positions, args.tokens, args.llama_cpp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
