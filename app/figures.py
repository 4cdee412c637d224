"""Plotly figures and HTML snippets built from events in their JSON form (dicts). No streamlit here.

Every token text that reaches HTML or a plotly label goes through `escape`: tokens can contain markup, and
plotly interprets a subset of HTML tags in labels and hover text.
"""
from __future__ import annotations

import functools
import html
from typing import Callable

import networkx as nx
import plotly.graph_objects as go

from specviz.decoding.events import CHAIN, GREEDY, POINT_MASS, TYPICAL
from specviz.decoding.events import rule_of as test_rule

KIND_COLOURS = {"accepted": "#b7efc5", "replacement": "#ffd6a5", "bonus": "#a0c4ff", "autoregressive": "#e4e4e4"}
KIND_LABELS = {
    "accepted": "accepted draft token",
    "replacement": "replacement (after a rejection)",
    "bonus": "bonus (the accepted path reached a leaf: no drafted child)",
    "autoregressive": "autoregressive (nothing drafted)",
}
STATUS_COLOURS = {
    "root": "#1f3b73",
    "accepted": "#2ca02c",
    "rejected": "#d62728",
    "passed": "#98df8a",
    "untested": "#b8b8b8",
    "replacement": "#ff7f0e",
    "bonus": "#1f77b4",
    "autoregressive": "#7f7f7f",
    "kept": "#1f77b4",
    "dropped": "#dddddd",
    "expanded": "#9ecae1",
}
STATUS_LABELS = {
    "root": "root (last committed token)",
    "accepted": "accepted path",
    "rejected": "tested, rejected",
    "passed": "passed the threshold, off the kept path",
    "untested": "never tested",
    "replacement": "replacement token",
    "bonus": "bonus token",
    "autoregressive": "target's own token",
    "kept": "kept",
    "dropped": "dropped",
    "expanded": "kept at an earlier depth",
}


TOOLBAR = {"orientation": "v"}  # plotly's toolbar down the right edge: across the top it covers the titles


def clear_of_toolbar(build: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
    """A figure builder whose figure keeps plotly's toolbar (shown on hover) off its title and subplot titles."""
    @functools.wraps(build)
    def built(*args, **kwargs) -> go.Figure:
        return build(*args, **kwargs).update_layout(modebar=TOOLBAR)
    return built


def escape(text: str) -> str:
    return html.escape(text, quote=True)


def visible(text: str) -> str:
    """Token text with whitespace made visible, for labels (· space, ↵ newline, ⇥ tab); not escaped."""
    if text == "":
        return "∅"
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥")


def label(text: str) -> str:
    """Token text for a plotly label or hover: markup escaped, quotes left as they are (plotly decodes &amp;, &lt;
    and &gt; but prints &quot; as it stands)."""
    return html.escape(visible(text), quote=False)


def md_code(text: str) -> str:
    """Token text as a Markdown code span that survives backticks inside it (Markdown renders no HTML there)."""
    import re

    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {visible(text)} {fence}"


def fmt(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# ------------------------------------------------------------------------------------------- charts


@clear_of_toolbar
def steps_chart(steps: list[dict]) -> go.Figure:
    """Tokens/s so far (line) and tokens committed per step by kind (stacked bars)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s so far", "tokens per step (by how they were made)"))
    xs = [s["step"] for s in steps]
    fig.add_trace(go.Scatter(x=xs, y=[s["timing"]["tokens_per_s"] for s in steps], mode="lines+markers",
                             name="tokens/s", line={"color": "#444"}, showlegend=False), row=1, col=1)
    for kind in KIND_COLOURS:
        ys = [sum(c["kind"] == kind for c in s["committed"]) for s in steps]
        if any(ys):
            fig.add_trace(go.Bar(x=xs, y=ys, name=KIND_LABELS[kind], marker_color=KIND_COLOURS[kind],
                                 marker_line={"color": "#888", "width": 0.5}), row=1, col=2)
    fig.update_layout(barmode="stack", height=300, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": -0.3})
    fig.update_xaxes(title_text="step")
    return fig


@clear_of_toolbar
def distribution_bars(top: list | None, title: str, colour: str, highlight: int | None = None,
                      point_mass: tuple[int, str] | None = None) -> go.Figure:
    """Bars over a top-N list [[id, text, prob], ...]; `highlight` outlines one token id.
    point_mass=(id, text) draws q = 1 on one token (a drafter with no q, such as n-gram lookup)."""
    rows = [[point_mass[0], point_mass[1], 1.0]] if point_mass else (top or [])
    names = unique_labels([(r[0], r[1]) for r in rows])
    fig = go.Figure(go.Bar(
        x=names, y=[r[2] for r in rows],
        marker_color=[colour] * len(rows),
        marker_line={"color": ["black" if r[0] == highlight else colour for r in rows],
                     "width": [3 if r[0] == highlight else 0 for r in rows]},
        hovertext=[f"{label(r[1])} (id {r[0]}): {r[2]:.4f}" for r in rows], hoverinfo="text",
    ))
    fig.update_layout(title=title, height=260, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      yaxis={"range": [0, 1], "title": "probability"})
    return fig


def unique_labels(pairs: list[tuple[int, str]]) -> list[str]:
    """Display labels for (token id, text), with the id added where two texts look the same."""
    shown = [label(t) for _, t in pairs]
    return [f"{s} ({i})" if shown.count(s) > 1 else s for s, (i, _) in zip(shown, pairs)]


@clear_of_toolbar
def u_gauge(alpha: float, u: float | None, rule: str = CHAIN) -> go.Figure:
    """The unit interval split at α: u below α accepts, above rejects (at temperature 0 there is no u)."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[alpha], y=[""], orientation="h", marker_color="#2ca02c", name="accept (u ≤ α)",
                         hoverinfo="skip"))
    fig.add_trace(go.Bar(x=[1 - alpha], y=[""], orientation="h", marker_color="#f4a6a6", name="reject (u > α)",
                         hoverinfo="skip"))
    if u is not None:
        fig.add_trace(go.Scatter(x=[u], y=[""], mode="markers+text", marker={"symbol": "triangle-down", "size": 18,
                      "color": "black"}, text=[f"<b>u = {u:.3f}</b>"], textposition="bottom center",
                      textfont={"color": "white", "size": 14}, name="u"))
    fig.update_layout(barmode="stack", height=160, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      xaxis={"range": [0, 1]}, legend={"orientation": "h", "y": -0.4},
                      title=f"α = {alpha:.3f}" + (" (greedy: no u, α is 1 or 0)" if rule == GREEDY else ""))
    return fig


@clear_of_toolbar
def threshold_gauge(p: float, threshold: float) -> go.Figure:
    """Medusa's typical test: P(x) against the threshold min(ε, δ · exp(−H)); passes when P(x) > threshold."""
    top = max(p, threshold) * 1.25
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[threshold], y=[""], orientation="h", marker_color="#f4a6a6", hoverinfo="skip",
                         name="fails (P(x) ≤ threshold)"))
    fig.add_trace(go.Bar(x=[top - threshold], y=[""], orientation="h", marker_color="#2ca02c", hoverinfo="skip",
                         name="passes (P(x) > threshold)"))
    fig.add_trace(go.Scatter(x=[p], y=[""], mode="markers+text", marker={"symbol": "triangle-down", "size": 18,
                  "color": "black"}, text=[f"<b>P(x) = {p:.3f}</b>"], textposition="bottom center",
                  textfont={"color": "white", "size": 14}, name="P(x)"))
    fig.update_layout(barmode="stack", height=160, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      xaxis={"range": [0, top]}, legend={"orientation": "h", "y": -0.4},
                      title=f"threshold = {threshold:.4f} (typical: no u, no α; a fixed cut on P)")
    return fig


@clear_of_toolbar
def level_categories(fig: go.Figure) -> go.Figure:
    """Category labels set level and broken onto lines at ":" and " / " (eagle2:lookup=4 / none), instead of
    rotated: plotly turns long labels on a narrow chart by 45-90°, and they take more height than the bars."""
    names = [x for t in fig.data for x in (t.x if t.x is not None else [t.name])]
    cats = list(dict.fromkeys(str(n) for n in names))
    fig.update_xaxes(tickangle=0, tickmode="array", tickvals=cats, automargin=True,
                     ticktext=[c.replace(" / ", "<br>/ ").replace(":", "<br>:") for c in cats])
    return fig


@clear_of_toolbar
def histogram_pair(labels: list[str], series: dict[str, list[float]], title: str, colours: dict | None = None) -> go.Figure:
    fig = go.Figure()
    for name, ys in series.items():
        fig.add_trace(go.Bar(x=labels, y=ys, name=name, marker_color=(colours or {}).get(name)))
    fig.update_layout(barmode="group", title=title, height=320, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      yaxis={"title": "share"}, legend={"orientation": "h", "y": -0.25})
    return fig


# -------------------------------------------------------------------------------------------- trees


def tree_layout(parents: dict, root=-1) -> dict:
    """(x, y) for each node id of a tree given as {id: parent}: x = depth, leaves on consecutive rows in the
    order children are listed (the verification order), each parent centred on its children."""
    graph = nx.DiGraph()
    graph.add_node(root)
    for node, parent in parents.items():
        graph.add_edge(parent, node)
    depth = nx.shortest_path_length(graph, root)
    pos, next_row = {}, 0
    for node in nx.dfs_postorder_nodes(graph, root):
        kids = list(graph.successors(node))
        if kids:
            y = sum(pos[k][1] for k in kids) / len(kids)
        else:
            y, next_row = next_row, next_row + 1
        pos[node] = (depth[node], y)
    return pos


@clear_of_toolbar
def _tree_figure(items: list[dict], title: str, height: int | None = None) -> go.Figure:
    """items: {"id", "parent", "label", "hover", "status"}; drawn left to right from the root (id -1)."""
    pos = tree_layout({it["id"]: it["parent"] for it in items if it["id"] != -1})
    fig = go.Figure()
    ex, ey = [], []
    for it in items:
        if it["id"] != -1:
            (x0, y0), (x1, y1) = pos[it["parent"]], pos[it["id"]]
            ex += [x0, x1, None]
            ey += [y0, y1, None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#999", "width": 1}, hoverinfo="skip",
                             showlegend=False))
    for status in STATUS_COLOURS:
        group = [it for it in items if it["status"] == status]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[pos[it["id"]][0] for it in group], y=[pos[it["id"]][1] for it in group],
            mode="markers+text", text=[it["label"] for it in group], textposition="top center",
            textfont={"family": "monospace", "size": 13},
            marker={"size": 16, "color": STATUS_COLOURS[status], "line": {"color": "#333", "width": 1}},
            hovertext=[it["hover"] for it in group], hoverinfo="text", name=STATUS_LABELS[status],
        ))
    rows = max((y for _, y in pos.values()), default=0) + 1
    depth = max((x for x, _ in pos.values()), default=0)
    fig.update_layout(
        title={"text": title, "y": 0.98, "yanchor": "top"}, height=height or max(300, min(900, 44 * rows + 150)),
        margin={"l": 10, "r": 10, "t": 90, "b": 10},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
        xaxis={"title": "depth (root = 0)", "dtick": 1, "range": [-0.4, depth + 0.6], "zeroline": False},
        yaxis={"visible": False, "range": [rows - 0.5, -0.9]}, plot_bgcolor="white",  # reversed: first child on top
    )
    return fig


def final_source(step: dict, greedy: bool = False) -> str:
    """Where the token that ended a step came from, by the rule its tests applied."""
    final, tests = step["final"], step["tests"]
    rule = test_rule(tests[-1], greedy, step.get("lossy", False)) if tests else (GREEDY if greedy else CHAIN)
    if rule == TYPICAL:
        if "rule" not in tests[-1]:  # a typical trace from before the tests named their rule sampled it from p
            return "drawn from p (typical acceptance as specviz ran it before it followed Medusa's selection)"
        return "the argmax of P = softmax(logits / T) after the kept path (Medusa's rule takes it, not a sample)"
    if rule == GREEDY:
        return "the target's argmax (greedy)"
    if final["kind"] != "replacement":
        return "drawn from p"
    if rule == POINT_MASS:
        return "drawn from p with the rejected tokens removed, renormalised"
    return "drawn from the residual max(0, p − q), normalised"


def rule_of(test: dict, greedy: bool = False, lossy: bool = False) -> str:
    """The acceptance rule a test applied, with its numbers: greedy, a point mass, a sample from q, or Medusa's
    typical threshold."""
    rule = test_rule(test, greedy, lossy)
    if rule == GREEDY:
        return f"greedy: accepted when x is the target's argmax (p = {fmt(test['p'])})"
    if rule == TYPICAL:
        passed = test["accepted"]
        threshold = "the threshold" if test.get("threshold") is None else f"threshold {fmt(test['threshold'], 4)}"
        return (f"typical (Medusa, lossy): P(x) = {fmt(test['p'], 4)} {'>' if passed else '≤'} {threshold} = "
                "min(ε, δ · exp(−H)), no u")
    if rule == POINT_MASS:
        return (f"point mass (x was picked, not sampled): α = p(x) = {fmt(test['p'])}, u = {fmt(test['u'])}; "
                "on a rejection x is removed from p and the rest renormalised")
    return (f"sampled from q: α = min(1, p/q) = min(1, {fmt(test['p'])} / {fmt(test['q'])}) = {fmt(test['alpha'])}, "
            f"u = {fmt(test['u'])}; on a rejection p becomes the residual max(0, p − q), normalised")


def step_tree_figure(step: dict, greedy: bool = False) -> go.Figure:
    """The verified draft tree of one step: accepted path, rejected and never-tested nodes (and, under Medusa's
    typical rule, nodes that passed off the kept path), and the token that ended the step (replacement or bonus)
    hanging off the last accepted node."""
    tests = {t["node"]: t for t in step["tests"]}
    path = set(step["accepted_path"])
    items = [{"id": -1, "parent": None, "label": "root", "hover": "root: the last committed token", "status": "root"}]
    for n in step["nodes"]:
        t = tests.get(n["id"])
        status = "accepted" if n["id"] in path else ("untested" if not t else "passed" if t["accepted"] else "rejected")
        picked = t is not None and t["q"] is None and n["q"] is not None  # a top-k child: ranked by q, not sampled
        hover = [f"<b>{label(n['text'])}</b> (id {n['token']}, node {n['id']}, depth {n['depth']})",
                 f"q = {fmt(n['q'])}" + (" (point mass: no q)" if n["q"] is None else
                                          " (the draft's probability: it ranked this top-k pick)" if picked else ""),
                 f"path score = {fmt(n['score'])}", f"p = {fmt(n['p'])}"]
        if t:
            passed_off = t["accepted"] and n["id"] not in path  # typical: passed, but a longer prefix was kept
            hover.append(f"tested: {rule_of(t, greedy, step.get('lossy', False))} → "
                         + ("passed, off the kept (longest) prefix" if passed_off else
                            "accepted" if t["accepted"] else "rejected"))
        else:
            hover.append("never tested (a sibling or an ancestor decided first)")
        items.append({"id": n["id"], "parent": n["parent"], "label": label(n["text"]), "hover": "<br>".join(hover),
                      "status": status})
    final = step["final"]
    items.append({"id": len(step["nodes"]), "parent": step["accepted_path"][-1] if step["accepted_path"] else -1,
                  "label": label(final["text"]), "status": final["kind"],
                  "hover": f"<b>{label(final['text'])}</b>: {final['kind']} token, " + final_source(step, greedy)})
    n_tested = len(step["tests"])
    title = (f"step {step['step']}: {len(step['nodes'])} drafted, {n_tested} tested, "
             f"{len(step['accepted_path'])} accepted, then 1 {final['kind']}")
    if len(step["committed"]) < len(step["accepted_path"]) + 1:
        title += f" (cut at the end of the text: {len(step['committed'])} committed)"
    return _tree_figure(items, title)


def build_stage_figure(step: dict, stage_index: int) -> go.Figure:
    """The tree as the drafter built it, up to stage `stage_index` of `step['build']`."""
    stages = step["build"][: stage_index + 1]
    current = stages[-1]
    candidates, kept_before = {}, set()
    for st in stages:
        if st["stage"] in ("expand", "lookup"):  # lookup: prompt lookup's branch grafted on (new or re-scored nodes)
            for c in st["candidates"]:
                candidates[c["cid"]] = c
    for st in stages[:-1]:
        if st["stage"] in ("expand", "lookup"):
            kept_before |= set(st["kept"])
    kept_now = set(current["kept"])
    items = [{"id": -1, "parent": None, "label": "root", "hover": "root", "status": "root"}]
    for cid, c in candidates.items():
        if current["stage"] == "rerank":
            status = "kept" if cid in kept_now else "dropped"
        elif cid in kept_now:
            status = "kept"  # at a lookup stage: the grafted path
        elif cid in kept_before:
            status = "expanded"
        else:
            status = "dropped"
        hover = (f"<b>{label(c['text'])}</b> (id {c['token']})<br>q = {fmt(c['q'])}"
                 + (" (grafted by prompt lookup: no q)" if c["q"] is None else "") + f"<br>path score = {fmt(c['score'])}")
        parent = c["parent_cid"] if c["parent_cid"] in candidates else -1  # a malformed trace still draws
        items.append({"id": cid, "parent": parent, "label": label(c["text"]), "hover": hover, "status": status})
    if current["stage"] == "expand":
        title = (f"expand depth {current['depth']}: {len(current['candidates'])} candidates, "
                 f"the {len(kept_now)} best by path score are expanded next")
    elif current["stage"] == "lookup":
        title = (f"prompt lookup: {len(current.get('candidates', []))} tokens grafted on, scored "
                 f"{fmt(current.get('rate'), 2)} per depth (the share of grafted tokens accepted so far)")
    elif current["stage"] == "rerank":
        title = f"rerank: the best {current.get('total_tokens')} candidates of the whole tree by path score become the draft"
    else:
        title = str(current["stage"])
    return _tree_figure(items, title)


def ancestors_mask(parents: list[int]) -> list[list[int]]:
    """(n + 1) × (n + 1): row i may attend column j when j is the root, i itself or an ancestor of i.
    Row/column 0 is the root, row i + 1 is node i."""
    n = len(parents)
    mask = [[0] * (n + 1) for _ in range(n + 1)]
    mask[0][0] = 1
    for i in range(n):
        row = mask[i + 1]
        row[0] = 1
        node = i
        while node != -1:
            row[node + 1] = 1
            node = parents[node]
    return mask


@clear_of_toolbar
def mask_figure(step: dict) -> go.Figure:
    names = unique_labels([(-1, "root")] + [(n["id"], f"{n['id']}:{n['text']}") for n in step["nodes"]])
    mask = ancestors_mask([n["parent"] for n in step["nodes"]])
    fig = go.Figure(go.Heatmap(
        z=mask, x=names, y=names, colorscale=[[0, "#f4f4f4"], [1, "#1f3b73"]], showscale=False,
        hovertext=[[f"{names[i]} {'sees' if mask[i][j] else 'does not see'} {names[j]}" for j in range(len(names))]
                   for i in range(len(names))], hoverinfo="text", xgap=1, ygap=1,
    ))
    size = max(260, min(700, 22 * len(names) + 120))
    fig.update_layout(title="tree attention mask (row attends to column)", height=size,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      yaxis={"autorange": "reversed", "tickfont": {"family": "monospace"}},
                      xaxis={"tickangle": -60, "tickfont": {"family": "monospace"}})
    return fig


# --------------------------------------------------------------------------------------------- race


@clear_of_toolbar
def race_timeline(name: str, steps: list[dict]) -> go.Figure:
    """Which tokens each step produced: one stacked bar per step, a segment per token coloured by kind."""
    fig = go.Figure()
    for kind in KIND_COLOURS:
        xs, ys, texts, hovers = [], [], [], []
        for s in steps:
            for pos, c in enumerate(s["committed"]):
                if c["kind"] == kind:
                    xs.append(s["step"])
                    ys.append(1)
                    texts.append(label(c["text"]))
                    hovers.append(f"step {s['step']}, token {pos + 1}: {label(c['text'])} ({kind})")
        if xs:
            fig.add_trace(go.Bar(x=xs, y=ys, name=KIND_LABELS[kind], marker_color=KIND_COLOURS[kind],
                                 marker_line={"color": "#777", "width": 0.5}, text=texts, textposition="inside",
                                 insidetextanchor="middle", textfont={"family": "monospace", "size": 10},
                                 hovertext=hovers, hoverinfo="text"))
    fig.update_layout(barmode="stack", title=f"{name}: tokens per step", height=260,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10}, showlegend=False,
                      xaxis={"title": "step (one target forward)"}, yaxis={"title": "tokens", "dtick": 1})
    return fig


@clear_of_toolbar
def timing_breakdown(runs: dict[str, list[dict]]) -> go.Figure:
    """Draft and verify milliseconds per step, one pair of stacked bars per drafter."""
    fig = go.Figure()
    for name, steps in runs.items():
        xs = [s["step"] for s in steps]
        fig.add_trace(go.Bar(x=xs, y=[s["timing"]["verify_ms"] for s in steps], name=f"{name} verify",
                             offsetgroup=name, legendgroup=name))
        fig.add_trace(go.Bar(x=xs, y=[s["timing"]["draft_ms"] for s in steps], name=f"{name} draft",
                             offsetgroup=name, legendgroup=name, base=[s["timing"]["verify_ms"] for s in steps],
                             marker_pattern_shape="/"))
    fig.update_layout(barmode="group", title="time per step: verify (target forward + test) and draft (hatched)",
                      height=320, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      xaxis={"title": "step"}, yaxis={"title": "ms"}, legend={"orientation": "h", "y": -0.25})
    return fig


@clear_of_toolbar
def acceptance_histogram_figure(histograms: dict[str, list[int]], title: str = "acceptance histogram",
                                no_draft: dict[str, int] | None = None) -> go.Figure:
    """Grouped bars, one group per run or method: of its verify steps that drafted something, the share that accepted
    0, 1, 2, … drafted tokens (specviz.analysis.acceptance_histogram; hover for the counts). `no_draft`: per name,
    the steps that drafted nothing, left out of the bars and given in the legend beside them."""
    fig = go.Figure()
    for name, counts in histograms.items():
        total = sum(counts)
        if total:
            nothing = (no_draft or {}).get(name)
            shown = label(name) + (f" (+{nothing:,} steps drafted nothing)" if nothing else "")
            fig.add_bar(name=shown, x=list(range(len(counts))), y=[c / total for c in counts], customdata=counts,
                        hovertemplate=f"{label(name)}: %{{customdata}} steps accepted %{{x}} (%{{y:.0%}})<extra></extra>")
    fig.update_layout(title=title, barmode="group", height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      xaxis={"title": "drafted tokens accepted in the step", "dtick": 1},
                      yaxis={"title": "share of the steps that drafted", "tickformat": ".0%"})
    return fig


def step_histogram(steps: list[dict], done: dict | None = None) -> list[int]:
    """A run's acceptance histogram (specviz.analysis.acceptance_histogram): from its trees, else the one its engine
    reported (vLLM), else from the drafted and accepted counts its steps carry (llama.cpp)."""
    from specviz.analysis import acceptance_histogram

    counts = acceptance_histogram(steps, done)
    drafting = [s for s in steps if s.get("drafted") and not s.get("nodes")]
    if counts or not drafting:
        return counts
    out = [0] * (max(s["drafted"] for s in drafting) + 1)
    for s in drafting:  # an engine that miscounts (more accepted than drafted) lands in the last bar, not an error
        out[min(sum(c["kind"] == "accepted" for c in s["committed"]), len(out) - 1)] += 1
    return out
