"""The event stream: what the engine reports at every step, as JSON-serialisable dataclasses.

This is the contract the CLI, the pages and the benchmark consume; docs/events.md describes it and
`SCHEMA` below validates it. Bump SCHEMA_VERSION on any incompatible change.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Union

from specviz.atomic import replacing
from specviz.decoding.policy import K_POLICIES, STOPS

SCHEMA_VERSION = 1  # traces of the same major version load; a minor one adds fields with defaults
SCHEMA_MINOR = 4  # 1: Start.detail, Step.drafted and Step.accepted; Step's detail fields optional. 2: Test.rule, .threshold
# 3: Start.k_policy, Step.stop. 4: Step.draft_forwards, stop "slower"
# the rule that decided a test: x drawn from q (α = min(1, p/q)); x picked, q = δx (α = p′(x)); p's argmax
# (temperature 0); Medusa's lossy threshold (specviz.decoding.verify.Typical)
CHAIN, POINT_MASS, GREEDY, TYPICAL = "chain", "point mass", "greedy", "typical"
RULES = (CHAIN, POINT_MASS, GREEDY, TYPICAL)
FULL, COUNTS = "full", "counts"  # the levels of detail a Start announces for its run's steps

# A top-N list: [[token_id, text, prob], ...], most likely first.
TopN = list[list[Any]]


@dataclass
class Start:
    model: str
    drafter: str
    sampling: dict[str, Any]  # {"temperature", "top_p", "top_k"}
    options: dict[str, Any]  # drafter settings (k, tree parameters, ...)
    seed: int
    max_new_tokens: int
    prompt_text: str
    prompt_token_ids: list[int]
    device: str
    dtype: str
    lossy: bool = False  # true only for an explicitly requested lossy acceptance rule
    detail: str = FULL  # what its steps carry: FULL (tree, p, q, u, residual) or COUNTS (drafted/accepted counts)
    engine: str = "specviz"  # what decoded it
    k_policy: str | None = None  # how the draft length was chosen: "cost" or "fixed" (specviz.decoding.policy)
    type: str = "start"
    schema_version: int = SCHEMA_VERSION
    schema_minor: int = SCHEMA_MINOR


@dataclass
class DraftNode:
    id: int
    token: int
    text: str
    parent: int  # -1 = the root (the last committed token)
    depth: int
    q: float | None  # q(token) under the draft distribution it was drawn from; None = point mass (no q)
    score: float | None  # draft path score where the drafter ranks nodes
    q_top: TopN | None  # top-N of that draft distribution
    p: float  # target p(token) at the node's parent (before any residual update)


@dataclass
class TargetRow:
    node: int  # -1 = after the root; else after that node
    p_top: TopN


@dataclass
class Test:
    node: int
    token: int
    text: str
    p: float
    q: float | None
    alpha: float
    u: float | None  # None when greedy (the decision is p's argmax) or typical (a threshold decides)
    accepted: bool  # typical: passed the threshold (the step keeps the longest passing prefix: accepted_path)
    residual_top: TopN | None  # normalised residual after this rejection
    rule: str | None = None  # one of RULES; None in traces written before the field existed
    threshold: float | None = None  # typical: the threshold p(x) had to exceed


@dataclass
class Committed:
    token: int
    text: str
    kind: str  # "accepted" | "replacement" | "bonus" | "autoregressive"


@dataclass
class Step:
    """One target forward. Every engine gives the first five fields; the detail fields (the tree, the target's
    rows, the tests and the replacement or bonus) come from an engine whose Start says detail "full" (ours), and
    are empty where it says "counts" (an engine that reports only how many drafted tokens it accepted)."""

    step: int
    position: int  # sequence position of the root token
    committed: list[Committed]
    text_delta: str  # text that became final in this step
    timing: dict[str, Any]  # {"draft_ms", "verify_ms", "step_ms", "elapsed_s", "tokens_per_s"} (what the engine measured)
    drafted: int | None = None  # drafted tokens verified in this step (None: not reported)
    accepted: int | None = None  # of them, accepted and committed
    nodes: list[DraftNode] = field(default_factory=list)
    build: list[dict[str, Any]] = field(default_factory=list)  # tree construction stages (EAGLE-2), may be empty
    target: list[TargetRow] = field(default_factory=list)  # the target's top-N at the root and each accepted node
    tests: list[Test] = field(default_factory=list)
    accepted_path: list[int] = field(default_factory=list)
    final: dict[str, Any] | None = None  # {"token", "text", "kind", "dist_top"}: the replacement or bonus and its distribution
    lossy: bool = False
    stop: str | None = None  # why the draft stopped: "cost", "confidence", "cap" or "no match" (None: not said)
    draft_forwards: int | None = None  # draft-model (or head) forwards run to draft, dropped tokens' included (None: not counted)
    type: str = "step"


@dataclass
class Done:
    text: str
    token_ids: list[int]
    stop_reason: str  # "eos" | "max_new_tokens"
    stats: dict[str, Any]
    text_delta: str = ""
    type: str = "done"


Event = Union[Start, Step, Done]


def to_dict(event: Event) -> dict[str, Any]:
    return asdict(event)


def from_dict(data: dict[str, Any]) -> Event:
    """The event object of one event's JSON (what to_dict gives): how a client of the service gets the same
    objects the engine yields."""
    kind = data.get("type")
    if kind == "start":
        return Start(**data)
    if kind == "done":
        return Done(**data)
    if kind != "step":
        raise ValueError(f"not a specviz event: type {kind!r}")
    return Step(**{
        **data,
        "nodes": [DraftNode(**n) for n in data.get("nodes", [])],
        "target": [TargetRow(**r) for r in data.get("target", [])],
        "tests": [Test(**t) for t in data.get("tests", [])],
        "committed": [Committed(**c) for c in data["committed"]],
    })


def write_trace(events: Iterable[Event | dict[str, Any]], path: str | Path) -> None:
    """One JSON object a line; written to a temporary file and renamed, so a failure leaves nothing half-written."""
    with replacing(path) as temp, open(temp, "w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e if isinstance(e, dict) else to_dict(e), ensure_ascii=False) + "\n")


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    from specviz.errors import SpecvizError

    events = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SpecvizError(f"{path}: line {n} is not JSON ({e.msg})") from None
    if not events or not all(isinstance(e, dict) for e in events) or events[0].get("type") != "start":
        raise SpecvizError(f"{path}: not a specviz trace (it must start with a 'start' event)")
    if events[0].get("schema_version") != SCHEMA_VERSION:
        raise SpecvizError(
            f"{path}: trace schema version {events[0].get('schema_version')}, this specviz reads {SCHEMA_VERSION}"
        )
    return events


def rule_of(test: dict[str, Any], greedy: bool, lossy: bool) -> str:
    """The rule that decided a test (one of RULES): its `rule`, or, in a trace written before tests carried it, what
    its numbers and the run's flags imply (no u: greedy at temperature 0, else the run's lossy typical rule)."""
    if test.get("rule"):
        return str(test["rule"])
    if test["u"] is None:
        return TYPICAL if lossy and not greedy else GREEDY
    return POINT_MASS if test["q"] is None else CHAIN


def replayed_text(events: Iterable[dict[str, Any]]) -> tuple[str, list[int]]:
    """Rebuild the generated text and token ids from the step events alone."""
    text, ids = "", []
    for e in events:
        if e["type"] in ("step", "done"):
            text += e["text_delta"]
        if e["type"] == "step":
            ids += [c["token"] for c in e["committed"]]
    return text, ids


# ---- JSON Schema (draft 2020-12) -------------------------------------------------------------------
_num = {"type": "number"}
_num_or_null = {"type": ["number", "null"]}
_int = {"type": "integer"}
_top = {
    "type": "array",
    "items": {"type": "array", "prefixItems": [_int, {"type": "string"}, _num], "minItems": 3, "maxItems": 3},
}
_top_or_null = {"anyOf": [_top, {"type": "null"}]}


def _obj(props: dict[str, Any], required: Iterable[str] | None = None) -> dict[str, Any]:
    """An object with these properties, all required unless `required` names the ones that are."""
    return {"type": "object", "properties": props, "required": list(props if required is None else required)}


SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "oneOf": [
        _obj(
            {
                "type": {"const": "start"},
                "schema_version": {"const": SCHEMA_VERSION},
                "model": {"type": "string"},
                "drafter": {"type": "string"},
                "sampling": _obj({"temperature": _num, "top_p": _num, "top_k": _int}),
                "options": {"type": "object"},
                "seed": _int,
                "max_new_tokens": _int,
                "prompt_text": {"type": "string"},
                "prompt_token_ids": {"type": "array", "items": _int},
                "device": {"type": "string"},
                "dtype": {"type": "string"},
                "lossy": {"type": "boolean"},
                "detail": {"enum": [FULL, COUNTS]},
                "engine": {"type": "string"},
                "k_policy": {"enum": [*K_POLICIES, None]},
                "schema_minor": _int,
            },
            required=("type", "schema_version", "model", "drafter", "sampling", "options", "seed", "max_new_tokens",
                      "prompt_text", "prompt_token_ids", "device", "dtype"),
        ),
        _obj(
            {
                "type": {"const": "step"},
                "step": _int,
                "position": _int,
                "nodes": {
                    "type": "array",
                    "items": _obj(
                        {
                            "id": _int,
                            "token": _int,
                            "text": {"type": "string"},
                            "parent": _int,
                            "depth": _int,
                            "q": _num_or_null,
                            "score": _num_or_null,
                            "q_top": _top_or_null,
                            "p": _num,
                        }
                    ),
                },
                "build": {"type": "array", "items": {"type": "object"}},
                "target": {"type": "array", "items": _obj({"node": _int, "p_top": _top})},
                "tests": {
                    "type": "array",
                    "items": _obj(
                        {
                            "node": _int,
                            "token": _int,
                            "text": {"type": "string"},
                            "p": _num,
                            "q": _num_or_null,
                            "alpha": _num,
                            "u": _num_or_null,
                            "accepted": {"type": "boolean"},
                            "residual_top": _top_or_null,
                            "rule": {"enum": [*RULES, None]},
                            "threshold": _num_or_null,
                        },
                        required=("node", "token", "text", "p", "q", "alpha", "u", "accepted", "residual_top"),
                    ),
                },
                "accepted_path": {"type": "array", "items": _int},
                "final": {"anyOf": [{"type": "null"}, _obj(
                    {
                        "token": _int,
                        "text": {"type": "string"},
                        "kind": {"enum": ["replacement", "bonus", "autoregressive"]},
                        "dist_top": _top,
                    }
                )]},
                "committed": {
                    "type": "array",
                    "items": _obj(
                        {
                            "token": _int,
                            "text": {"type": "string"},
                            "kind": {"enum": ["accepted", "replacement", "bonus", "autoregressive"]},
                        }
                    ),
                },
                "text_delta": {"type": "string"},
                "timing": _obj(
                    {"draft_ms": _num, "verify_ms": _num, "step_ms": _num, "elapsed_s": _num, "tokens_per_s": _num}
                ),
                "lossy": {"type": "boolean"},
                "drafted": {"type": ["integer", "null"]},
                "accepted": {"type": ["integer", "null"]},
                "stop": {"enum": [*STOPS, None]},
                "draft_forwards": {"type": ["integer", "null"]},
            },
            required=("type", "step", "position", "committed", "text_delta", "timing"),
        ),
        _obj(
            {
                "type": {"const": "done"},
                "text": {"type": "string"},
                "token_ids": {"type": "array", "items": _int},
                "stop_reason": {"enum": ["eos", "max_new_tokens"]},
                "text_delta": {"type": "string"},
                "stats": _obj(
                    {
                        "steps": _int,
                        "new_tokens": _int,
                        "tau": _num,
                        "acceptance_rate": _num_or_null,
                        "drafted": _int,
                        "accepted": _int,
                        "per_position_acceptance": {"type": "array", "items": _num},
                        "wall_s": _num,
                        "tokens_per_s": _num,
                        "draft_s": _num,
                        "verify_s": _num,
                    }
                ),
            }
        ),
    ],
}


def validate(event: Event | dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when an event does not follow the documented schema."""
    from specviz.schemacheck import check

    check(event if isinstance(event, dict) else to_dict(event), SCHEMA)
