"""What the teaching pages compute from a run's events: how each test of a step was verified (with the other rule
beside it), the acceptance numbers under every name they go by, the topologies compared, and the self-check
questions of the lab. No streamlit here: the functions are tested on their own."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from specviz import analysis
from specviz.bench import REFERENCE_REPORT
from specviz.decoding.events import CHAIN, GREEDY, POINT_MASS, TYPICAL, rule_of
from specviz.drafters import PLAIN, REGISTRY, DrafterSpec
from specviz.paths import ASSETS

# ------------------------------------------------------------------------------------------ sources

LEVIATHAN = "Leviathan, Kalman & Matias, 2023, *Fast Inference from Transformers via Speculative Decoding*"
CHEN = "Chen et al., 2023, *Accelerating Large Language Model Decoding with Speculative Sampling*"
SPECINFER = ("Miao et al., 2024, *SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative "
             "Inference and Verification*")
MEDUSA = "Cai et al., 2024, *Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads*"
EAGLE = "Li et al., 2024, *EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty*"
EAGLE2 = "Li et al., 2024, *EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees*"
EAGLE2_V1 = f"{EAGLE2}, arXiv:2406.16858v1 (its abstract)"  # the EMNLP 2024 abstract says up to 5×, 1.3× EAGLE's
EAGLE3 = "Li et al., 2025, *EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test*"
PROMPT_LOOKUP = "Saxena, 2023, *Prompt Lookup Decoding* (github.com/apoorvumang/prompt-lookup-decoding)"
VLLM_METRICS = "vLLM documentation, *Speculative decoding* metrics (mean acceptance length)"
VLLM_LOSSLESS = ("vLLM documentation, *Speculative Decoding*, “Lossless guarantees”: lossless “up to the precision "
                 "limits of hardware numerics”")
VLLM_PER_REQUEST = "vLLM documentation, *Per-Request Acceptance Metrics* (`acceptance_histogram`, experimental)"
SAFEAILAB_EAGLE = ("SafeAILab/EAGLE, the EAGLE-2/3 code: `evaluate_posterior` in `eagle/model/utils.py` (q(x) = 1 for "
                   "a tree child; a rejected child's p set to 0 and p renormalised)")
MEDUSA_CODE = "FasterDecoding/Medusa, `medusa_generate` (posterior_threshold = 0.09, posterior_alpha = 0.3)"

# ------------------------------------------------------------------------------------- said once, used everywhere

GREEDY_IDENTITY = (
    "At temperature 0 a drafted token is accepted only when it is the target's argmax, so the output is the "
    "target's own greedy output **up to floating-point near-ties**: verifying K + 1 tokens in one (tree-masked) "
    "forward adds the same products in a different order than plain decoding's one-token forward, and where the "
    "target's two most likely tokens have logits within rounding of each other the argmax can come out the other "
    "way. Such a flip is rarer in float32 (24 significant bits) than in bfloat16 (8), the usual GPU precision. "
    f"Sources: {CHEN} (the output is the target's “within hardware numerics”); {VLLM_LOSSLESS}. The bench reports "
    "such a flip as a numerics event with the target's two logits, not as a failed drafter "
    "(`specviz/bench/numerics.py`).")

HISTOGRAM_NOTE = (
    "**Reading the acceptance histogram** (verify steps that drafted something, by how many drafted tokens they "
    "accepted, the replacement/bonus token not counted; steps that drafted nothing are left out, as vLLM's "
    f"per-request histogram leaves them out ({VLLM_PER_REQUEST}), and counted beside it): a head that is right early "
    "and wrong late puts most steps at 1 or 2 and few at the full depth, the counts falling step by step; a lookup "
    "that is all or nothing puts its drafting steps at 0 (a wrong continuation) and at the whole copied span, with "
    "little between, and a step where it found no match drafts nothing and is not in the histogram at all. "
    "Per-position acceptance gives the same information per depth. The histogram's mean plus one is vLLM's mean "
    "acceptance length (llama.cpp's mean length), 1 + accepted ÷ steps that drafted; τ divides by every step, so "
    "τ = 1 + accepted ÷ all steps (less at an end-of-sequence cut), and the two agree only when every step drafts. "
    "In the default-settings bench at T = 0 (`docs/results/bench-default-t0.json`) `ngram` drafted in 3,604 of its "
    "6,405 steps: 1.82 against τ 1.46. A request where the drafter drafts and misses shows as a pile at 0; one where "
    "it finds nothing to draft shows only in the count beside the histogram.")

TYPICAL_NOTE = (
    "**Medusa's typical acceptance (lossy).** Not a rejection test: there is no u and no α. With P = softmax(logits "
    "/ T) at the parent (temperature only; top-k and top-p play no part), a drafted token passes when P(x) > min(ε, "
    "δ · exp(−H(P))), ε = 0.09 and δ = 0.3 by default. Every root-to-leaf path of the tree is a candidate; the step "
    "keeps the one with the most passing tokens before its first failure (ties: the larger Σ log P over them), so "
    "a token can pass and still be off the kept path. The step's last token is P's argmax after the kept path, "
    "not a sample. The output no longer follows p: this run is marked lossy. This is the selection of "
    "FasterDecoding/Medusa's `evaluate_posterior` as `medusa_generate` runs it (its `fast` path).")

LOSSY_NOTE = (
    "This run used a **lossy** acceptance rule (Medusa's typical acceptance, asked for with `medusa:typical=true`): "
    "its output does not follow the target's distribution, and at T > 0 it is not what plain sampling from the "
    "target would give. The *Rejection sampling lab* and the *EAGLE tree explorer* show how each of its tests was "
    "decided.")

LETTERS_NOTE = (
    f"Letters: here, as in {LEVIATHAN.split(',')[0]} et al., **p is the target's** distribution and **q the draft's**. "
    f"{CHEN.split(',')[0]} write the same rule with the letters swapped (q the target, p the draft: accept "
    "with min(1, q(x)/p(x)), residual (q − p)₊), as does gpt-fast's code; translate before comparing.")

# ------------------------------------------------------------------------------------ tree verification


def _parent_text(step: dict, node: dict) -> str:
    return "the root" if node["parent"] < 0 else repr(step["nodes"][node["parent"]]["text"])


Q_DRAFT = "q(x), the draft's"  # one q per node, on every view: the node's own, whatever rule tested it
POINT_MASS_Q = ("The draft picked x (its top-k, or a lookup), so the test treats x as a point mass, q = δx, and "
                "α = p(x): q(x) is what the draft ranked x by, not a number the test reads.")


def q_text(node: dict) -> str:
    """A node's q as every view shows it: the draft's probability of the token, or why there is none."""
    return "— (no draft distribution)" if node.get("q") is None else f"{node['q']:.4f}"


RULE_TEXT = {
    GREEDY: "greedy: accept iff x is the target's argmax",
    POINT_MASS: "point mass: α = p'(x)",
    CHAIN: "sampled: α = min(1, p/q)",
    TYPICAL: "typical (lossy): P(x) > min(ε, δ·e^−H)",
}


def verification_walkthrough(step: dict, greedy: bool) -> list[dict]:
    """One row per acceptance test of a step, in the order they ran, with the rule applied and the other rule on
    the same numbers.

    For a picked token (a point mass, the test's q is null) α = p'(x), where p' is the target's p at the parent
    with the siblings rejected before it removed and renormalised: p'(x) = p(x) ÷ (1 − Σ p(rejected siblings)).
    `expected_p` is that value computed from the nodes' own p (the target's, before any update), so a row whose
    `p_used` differs from it would expose a verification bug. For a sampled token α = min(1, p/q) and the
    residual max(0, p − q) replaces p after a rejection. `chain_alpha` is what the sampled-chain rule would give
    the same token with the draft's q (what the draft ranked it by), to set the two rules side by side. A typical
    test (Medusa's lossy rule) compares P(x) with its `threshold` and updates nothing."""
    rows = []
    rejected_at: dict[int, float] = {}  # parent id → Σ p of the point masses rejected there so far
    for order, test in enumerate(step["tests"], 1):
        node = step["nodes"][test["node"]]
        parent = node["parent"]
        before = rejected_at.get(parent, 0.0)
        kind = rule_of(test, greedy, step.get("lossy", False))
        point_mass = kind == POINT_MASS
        q_draft = node["q"]
        chain_alpha = None if kind == GREEDY or not q_draft else min(1.0, node["p"] / q_draft)
        rows.append({
            "order": order,
            "node": test["node"],
            "depth": node["depth"],
            "parent": _parent_text(step, node),
            "token": node["text"],
            "p (target, at the parent)": node["p"],
            "p used by the test": test["p"],
            "expected_p": node["p"] / (1.0 - before) if point_mass and before < 1.0 else None,
            "q (draft)": q_draft,
            "rule": RULE_TEXT[kind],
            "rule_name": kind,
            "threshold": test.get("threshold"),
            "α": test["alpha"],
            "u": test["u"],
            "accepted": test["accepted"],
            "chain_alpha": chain_alpha,
        })
        if point_mass and not test["accepted"]:
            rejected_at[parent] = before + node["p"]
    return rows


def point_mass_samples(p, candidates: list[int], n: int, seed: int = 0, keep_rejected: bool = False) -> np.ndarray:
    """n outputs of the multi-candidate point-mass rule: try each candidate x in turn with α = p'(x), p' = p with
    the rejected candidates removed and renormalised; if every one is rejected, draw from what is left of p.
    `keep_rejected=True` plants a bug: rejected candidates stay in p' (no removal), which is no longer lossless."""
    rng = np.random.default_rng(seed)
    p = np.asarray(p, dtype=float)
    p = p / p.sum()
    out = np.empty(n, dtype=int)
    for i in range(n):
        left = p.copy()
        chosen = -1
        for x in candidates:
            mass = left.sum()
            if rng.random() < left[x] / mass:
                chosen = x
                break
            if not keep_rejected:
                left[x] = 0.0
        if chosen < 0:
            chosen = int(rng.choice(len(p), p=left / left.sum()))
        out[i] = chosen
    return out


# ---------------------------------------------------------------------------------- acceptance numbers


@dataclass(frozen=True)
class AcceptanceNumbers:
    """The same run's acceptance, under each definition in use."""

    steps: int
    new_tokens: int
    drafted: int  # every drafted token (every node of a tree)
    tested: int  # drafted tokens the acceptance test ran on
    accepted_tested: int  # of those, the ones the test accepted (also past an end-of-sequence cut)
    accepted: int  # drafted tokens accepted and committed
    tau: float  # tokens committed per target forward, the replacement/bonus token included
    per_position: list[float]  # of the steps whose draft reached depth d, the share accepting a token at depth d
    reached: list[int]
    drafting_steps: int = 0  # steps that drafted at least one token

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's (and llama.cpp's "mean len"): 1 + accepted ÷ steps that drafted. τ divides by every step."""
        return 1 + self.accepted / self.drafting_steps if self.drafting_steps else None

    @property
    def per_drafted(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def per_tested(self) -> float | None:
        return self.accepted_tested / self.tested if self.tested else None

    @property
    def accepted_per_step(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0


def acceptance_numbers(events: list[dict]) -> AcceptanceNumbers:
    """From a run's done event (the engine's own counts) and its tests as analysis.summarise counts them (the
    Cost page's α is the same number)."""
    stats = events[-1]["stats"]
    summary = analysis.summarise(events)
    return AcceptanceNumbers(
        steps=stats["steps"], new_tokens=stats["new_tokens"], drafted=stats["drafted"], tested=summary.tested,
        accepted_tested=summary.accepted_tested, accepted=stats["accepted"], tau=stats["tau"],
        per_position=list(stats["per_position_acceptance"]), reached=list(stats.get("reached") or []),
        drafting_steps=sum(analysis.acceptance_histogram([e for e in events if e["type"] == "step"], events[-1])),
    )


# ------------------------------------------------------------------------------------------- topologies


@dataclass(frozen=True)
class Topology:
    drafter: str
    name: str
    reads: str
    training: str
    overhead: str  # what it adds to memory besides the target
    lossless: str
    published: str  # the paper's headline speedup, with model and hardware
    source: str
    weights: str | None = None  # the shipped folder under assets/, if any


TOPOLOGIES = (
    Topology(
        "draft", "Independent draft model",
        "tokens only: a small language model with the target's tokenizer runs autoregressively, K steps per round",
        "none if a small model of the same family exists; here a 3-layer model distilled from the target's answers",
        "a whole second model and its own KV cache",
        "yes: a sampled chain, α = min(1, p/q) and the residual max(0, p − q)",
        "T5-XXL (11B) with a T5-small draft: 3.4× and 3.1× at T = 0, 2.6× and 2.3× at T = 1 (English–German "
        "translation, CNN/DM summarisation; one TPU-v4; the abstract's 2×–3× is that range rounded, over the drafts it tried); Chinchilla "
        "70B with a 4B draft: 2–2.5× (distributed, on TPU-v4)",
        f"{LEVIATHAN}; {CHEN}", "draft-smollm2-135m"),
    Topology(
        "medusa", "Medusa heads",
        "the target's last hidden state at the last committed token: head i predicts the token i + 1 ahead, all "
        "heads at once, combined into a fixed tree of their top-k picks",
        "heads trained on the frozen target's features (Medusa-1), or jointly with it (Medusa-2, which changes the "
        "target)",
        "per head a residual block and, in the published Medusa heads, its own hidden × vocabulary output layer, "
        "which dominates its size (4,096 × 32,000 ≈ 131M parameters a head on Vicuna-7B); the heads shipped here "
        "share the target's LM head instead, so each adds one residual block (no KV cache of their own)",
        "with the rejection rule (its tree children are point masses), yes; with Medusa's *typical acceptance* "
        "(`medusa:typical=true`; its paper proposes it for temperature > 0 in place of rejection sampling), **no**: "
        "the output no longer follows p. specviz runs it as Medusa's code does (`evaluate_posterior`, the `fast` path "
        "of `medusa_generate`): P = softmax(logits / T), temperature only; a token passes when P(x) > min(0.09, "
        "0.3 · exp(−H(P))); of all root-to-leaf paths the one with the longest passing prefix is kept (ties: the "
        "larger Σ log P), and the step's last token is P's argmax, not a sample",
        "Vicuna-7B/13B/33B and Zephyr-7B: Medusa-1 over 2.2×, Medusa-2 2.3×–3.6× (the abstract's ranges)",
        f"{MEDUSA}; {MEDUSA_CODE}", "medusa-smollm2-135m"),
    Topology(
        "eagle2", "EAGLE-2 (Extrapolation Algorithm for Greater Language-model Efficiency)",
        "the target's top-layer feature (its last hidden state, before the LM head: EAGLE's \"second-to-top "
        "layer\", counting the LM head) plus the token sampled one step ahead (the next token), "
        "predicting the next feature; a dynamic tree grown by the draft's own path confidence",
        "one decoder layer trained to regress the target's features and predict its tokens (self-distilled here)",
        "one decoder layer and a small KV cache; reuses the target's embedding and LM head",
        "yes: tree children are point masses, α = p'(x)",
        "EAGLE: LLaMA2-Chat 70B 2.7×–3.5× (over MT-bench, HumanEval, GSM8K and Alpaca; 4× A100 40 GB); EAGLE-2: "
        "3.05×–4.26×, 20–40 % faster than EAGLE (arXiv v1 abstract; the EMNLP 2024 version: up to 5×, 1.3× EAGLE's)",
        f"{EAGLE}; {EAGLE2_V1}", "eagle-smollm2-135m"),
    Topology(
        "eagle3", "EAGLE-3 (training-time test)",
        "the inputs of three of the target's layers (low, middle, high) side by side, fused by one linear layer, "
        "plus the next token; deeper in the tree its own output instead; the same dynamic tree as EAGLE-2",
        "one decoder layer trained only to predict the target's tokens (no feature regression), with its own "
        "outputs fed back over several unrolled steps (training-time test); self-distilled here",
        "the fusion layer, one decoder layer and a small KV cache; reuses the target's embedding (and here its LM "
        "head rows over a reduced draft vocabulary)",
        "yes: tree children are point masses, α = p'(x)",
        "speedup up to 6.5×, about 1.4× over EAGLE-2 (chat and reasoning models)",
        EAGLE3, "eagle3-smollm2-135m"),
    Topology(
        "ngram", "Prompt lookup (n-gram)",
        "tokens only: finds the last n-gram of the context earlier in the context and proposes what followed it",
        "none",
        "none",
        "yes: a copied token is a point mass, α = p(x)",
        "2×–4× on input-grounded tasks (summarisation, question answering over a document)",
        PROMPT_LOOKUP),
)


def cards() -> list[Topology]:
    """One card per registered drafter but the plain one: those written above, then one drawn from the spec of any
    other (its help and the part it needs), so a drafter added to the registry gets a card too."""
    return [*TOPOLOGIES, *(card_of(s) for n, s in REGISTRY.items() if n != PLAIN and n not in {t.drafter for t in TOPOLOGIES})]


def card_of(spec: DrafterSpec) -> Topology:
    return Topology(spec.name, spec.help[:1].upper() + spec.help[1:], spec.help, "see its module",
                    f"the loaded `{spec.needs}`" if spec.needs else "none",
                    "yes, unless its runs are marked lossy: the loop verifies every drafted token", "", "")


EAGLE3_NOTE = (
    "**EAGLE-3** drops EAGLE's feature-regression loss, "
    "replaces the target's top-layer feature (the last hidden state, which EAGLE's paper calls the second-to-top "
    "layer, counting the LM head) with the inputs of a low, a middle and a high layer side by side (SafeAILab's "
    "code: layers 2, L/2 and L − 3 of an L-layer target), fused by one linear layer, and "
    "trains with the draft's own predictions fed back (*training-time test*); it reports speedups up to 6.5× and "
    "about 1.4× over EAGLE-2 (" + EAGLE3 + "). specviz runs both on the same EAGLE-2 tree: `eagle2` is an "
    "EAGLE-1/2 head, `eagle3` an EAGLE-3 head (the embedded model's own, or a published one: "
    "`eagle3:head=FOLDER`). The *EAGLE tree explorer* drafts with both on the same step.")

EAGLE3_CHANGES = """
What EAGLE-3 changes, and what stays:

| | `eagle2` (EAGLE-1/2 head) | `eagle3` (EAGLE-3 head) |
|---|---|---|
| feature at the root | the target's top hidden state f_t | the inputs of three target layers (low, middle, high) side by side, fused: x = fc([g_low ; g_mid ; g_high]) |
| deeper in the tree | its prediction f̂ of the next feature | its own output h, before its final norm: no longer a guess of a target feature |
| layer input | fc([emb(x_{t+1}) ; f_t]) | [input_norm(emb(x_{t+1})) ; hidden_norm(x)], 2·H wide, read by q, k and v |
| q | softmax(lm_head(f̂)) | softmax(lm_head(norm(h))) over a draft vocabulary (draft id i = target token i + d2t[i]) |
| training loss | regress f_{t+1} (smooth L1) + 0.1 × cross-entropy against p | cross-entropy against p only |
| training inputs | the true features (and one fed-back step here) | its own outputs fed back over several unrolled steps, masked as in drafting (*training-time test*) |
| tree, verification | EAGLE-2's dynamic tree; point masses, α = p′(x) | the same |

Only the drafting differs: the tree and the verification rule are one and the same code, so both produce the
target's output (at temperature 0 its greedy text, up to floating-point near-ties).
"""


def reference_report() -> dict | None:
    """The bench report the app ships (the embedded model on MT-bench at temperature 0), or None if absent."""
    try:
        return json.loads(REFERENCE_REPORT.read_text())
    except (OSError, ValueError):
        return None


def shipped_weights_mb(folder: str | None) -> float | None:
    """Size on disk of a shipped drafter's weights (fp16 safetensors), in MB."""
    if folder is None:
        return None
    files = list((ASSETS / folder).glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) / 1e6 if files else None


def measured_rows(report: dict | None) -> dict[str, dict]:
    """drafter → {τ, acceptance, speedup} from the shipped bench report."""
    if not report:
        return {}
    rows = {}
    for name, d in report["drafters"].items():
        if "head=" in name:  # a variant with another head file, kept in the report for comparison
            continue
        drafting = sum(d.get("acceptance_histogram") or [])
        rows[name] = {"tau": d["tau"], "acceptance": d["acceptance_rate"],
                      "speedup": d["speedup_vs_none"]["median"], "per_position": d["per_position_acceptance"],
                      "mean_acceptance_length": 1 + d["accepted"] / drafting if drafting else None}
    return rows


ENGINE_NAMES = {"vllm": "vLLM", "llamacpp": "llama.cpp"}  # a Start's engine, as a page names it
ENGINE_ROUNDING = {"vllm": "vLLM's kernels round otherwise",  # why its greedy text may part from ours
                   "llamacpp": "llama.cpp quantizes the activations to 8 bits and sums in its own order"}


def other_engine_note(lane: str, engine: str) -> str:
    """Why a lane another engine decoded is compared with `none`'s greedy text for information only."""
    name = ENGINE_NAMES.get(engine, engine)
    return (f"`{lane}` ran on {name}, with its own copy of the model: at temperature 0 its text is compared with "
            f"`none`'s for information only, since {ENGINE_ROUNDING.get(engine, f'{name} rounds otherwise')}, so the "
            "two may part at a near-tie of the target's two most likely tokens.")


def counts_note(engine: str) -> str:
    """One line where a run came from an engine that reports counts only (vLLM, llama.cpp): what it cannot show."""
    return (f"This run came from {ENGINE_NAMES.get(engine, engine)}, which reports per verify step only how many drafted tokens it accepted "
            "and the tokens it committed: it exposes no q, no draft tree and no u, so the tree explorer, the "
            "rejection-sampling lab and the per-token p have nothing to show for it. Tokens are coloured by "
            "accepted and bonus as the step counts say.")
