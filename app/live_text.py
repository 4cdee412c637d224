"""The generated text of a run as HTML: coloured spans, one per committed token, each with the test behind it on
hover, and the legend of their colours. No streamlit here."""
from __future__ import annotations

from app.figures import KIND_COLOURS, KIND_LABELS, escape, final_source, fmt, rule_of, visible


def legend_html() -> str:
    chips = "".join(
        f'<span style="background:{KIND_COLOURS[k]};padding:2px 6px;border-radius:4px;margin-right:8px">'
        f"{escape(KIND_LABELS[k])}</span>"
        for k in KIND_COLOURS
    )
    return f'<div style="font-size:0.85em;margin-bottom:6px">{chips}</div>'


def token_hover(step: dict, index: int, greedy: bool = False) -> str:
    """What made the step's committed token `index`, for its hover: the test that accepted a drafted token (its p,
    q, α, u and rule), the test whose rejection a replacement follows, where a replacement or bonus was drawn from.
    A counts-only trace (vLLM, llama.cpp) has no tests: its hover names the kind only."""
    committed = step["committed"][index]
    lines = [f"step {step['step']}: {KIND_LABELS[committed['kind']]}"]
    tests = {t["node"]: t for t in step.get("tests") or []}
    lossy = step.get("lossy", False)
    path = step.get("accepted_path") or []

    def test_line(test: dict) -> str:
        q = step["nodes"][test["node"]].get("q")
        outcome = "accepted" if test["accepted"] else "rejected"
        return f"x = {visible(test['text'])}: {rule_of(test, greedy, lossy)}; q(x), the draft's: {fmt(q, 4)} → {outcome}"

    if committed["kind"] == "accepted" and index < len(path) and path[index] in tests:
        lines.append(test_line(tests[path[index]]))
    elif committed["kind"] != "accepted" and step.get("final"):
        if committed["kind"] == "replacement" and step.get("tests"):
            lines.append("after " + test_line(step["tests"][-1]))
        lines.append(f"this token: {final_source(step, greedy)}")
    return "\n".join(lines)


def tokens_html(steps: list[dict], prompt: str | None = None, greedy: bool = False) -> str:
    """The generated text as coloured spans, one per committed token; hover shows the step, the kind and the test
    behind the token (`token_hover`)."""
    spans = []
    for s in steps:
        for i, c in enumerate(s["committed"]):
            spans.append(
                f'<span class="specviz-token" title="{escape(token_hover(s, i, greedy))}" '
                f'style="background:{KIND_COLOURS[c["kind"]]};border-radius:3px;padding:1px 0">{escape(c["text"])}</span>'
            )
    body = "".join(spans) or '<span style="color:#888">(no tokens yet)</span>'
    head = ""
    if prompt is not None:
        head = f'<div style="color:#666;margin-bottom:4px"><b>Prompt:</b> {escape(prompt)}</div>'
    return (
        f'<div class="specviz-output">{head}<div style="white-space:pre-wrap;font-family:monospace;'
        f'line-height:1.7;border:1px solid #ddd;border-radius:6px;padding:10px">{body}</div></div>'
    )
