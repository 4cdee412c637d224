"""The teaching pages: tree verification shown as it ran (point masses beside the chain rule), the acceptance
numbers under each name, the topology comparison, the guided path and the lab's self-check on real tests."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, ok, open_page

from app import quiz, teaching
from specviz import analysis
from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.drafters import PLAIN, REGISTRY

from tiny import TinyTokenizer, decode_settings, tiny_llama
from tree_drafters import TopBTree

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


@pytest.fixture(scope="module")
def tree_run() -> list[dict]:
    """A sampled run (T = 1) of a top-3 tree drafter on tiny models: every child a point mass, many rejections."""
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=1, layers=1, scale=3.0)
    with torch.no_grad():
        events = engine.decode(target, TinyTokenizer(64), TopBTree(draft, b=3, depth=3), PROMPT,
                               decode_settings(max_new_tokens=48, temperature=1.0, seed=3))
        return [ev.to_dict(e) for e in events]


def test_the_walkthrough_recomputes_every_point_mass_test_from_the_nodes(tree_run):
    """p used by a sibling's test = p(x) ÷ (1 − Σ p of the siblings rejected before it): the engine's residual
    for point masses, recomputed from the nodes' own (un-updated) p."""
    checked = 0
    for step in (e for e in tree_run if e["type"] == "step"):
        for row in teaching.verification_walkthrough(step, greedy=False):
            assert row["rule"] == "point mass: α = p'(x)"
            assert row["α"] == pytest.approx(row["p used by the test"])
            assert row["p used by the test"] == pytest.approx(row["expected_p"], rel=1e-4)
            assert row["chain_alpha"] == pytest.approx(min(1.0, row["p (target, at the parent)"] / row["q (draft)"]))
            checked += row["expected_p"] != row["p (target, at the parent)"]
    assert checked > 5  # siblings tested after a rejection, where the renormalisation shows


def test_the_walkthrough_catches_a_verifier_that_forgets_the_removal(tree_run):
    """The check has the power to fail: tests rewritten as if rejected siblings stayed in p are flagged."""
    flagged = 0
    for step in (e for e in tree_run if e["type"] == "step"):
        broken = {**step, "tests": [{**t, "p": step["nodes"][t["node"]]["p"]} for t in step["tests"]]}
        for row in teaching.verification_walkthrough(broken, greedy=False):
            flagged += row["p used by the test"] != pytest.approx(row["expected_p"], rel=1e-4)
    assert flagged > 5


def test_greedy_steps_are_explained_by_the_argmax_rule():
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=1, layers=1, scale=3.0)
    with torch.no_grad():
        trace = [ev.to_dict(e) for e in engine.decode(target, TinyTokenizer(64), TopBTree(draft, b=2, depth=2),
                                                      PROMPT, decode_settings(max_new_tokens=16))]
    rows = [r for s in trace if s["type"] == "step" for r in teaching.verification_walkthrough(s, greedy=True)]
    assert rows and all(r["rule"].startswith("greedy") and r["chain_alpha"] is None for r in rows)
    assert all(r["α"] == (1.0 if r["accepted"] else 0.0) for r in rows)


def test_point_mass_siblings_are_lossless_and_the_planted_bug_is_caught():
    p = np.array([0.40, 0.25, 0.15, 0.15, 0.05])
    candidates = [1, 4]  # the top-2 of q = (0.1, 0.5, 0.1, 0.1, 0.2), the lab's default
    right = np.bincount(teaching.point_mass_samples(p, candidates, 20_000, seed=0), minlength=5)
    wrong = np.bincount(teaching.point_mass_samples(p, candidates, 20_000, seed=0, keep_rejected=True), minlength=5)
    assert analysis.goodness_of_fit(right, p)["p_value"] > 1e-3
    assert analysis.goodness_of_fit(wrong, p)["p_value"] < 1e-9


def test_acceptance_numbers_under_each_name(tree_run):
    numbers = teaching.acceptance_numbers(tree_run)
    stats = tree_run[-1]["stats"]
    assert numbers.per_drafted == pytest.approx(stats["acceptance_rate"])
    assert numbers.per_tested == pytest.approx(analysis.summarise(tree_run).alpha)
    assert numbers.tau == pytest.approx(numbers.new_tokens / numbers.steps)
    assert numbers.drafted > numbers.tested >= numbers.accepted  # a tree tests only some of what it drafts
    assert numbers.per_drafted < numbers.per_tested
    assert numbers.accepted_per_step <= numbers.tau - 1 + 1e-9  # every step adds one token of its own
    # at an end-of-sequence cut the engine commits fewer accepted tokens than the tests accepted: α (÷ tested)
    # counts the tests, as the Cost page does, and the acceptance rate counts what was committed
    cut = [*tree_run[:-1], {**tree_run[-1], "stats": {**stats, "accepted": stats["accepted"] - 1}}]
    assert teaching.acceptance_numbers(cut).per_tested == numbers.per_tested
    assert teaching.acceptance_numbers(cut).per_drafted < numbers.per_drafted


def test_self_check_questions_are_answered_by_the_engine_values(tree_run):
    qs = quiz.questions(tree_run, seed=1)
    assert len(qs) == 6 and {q.kind for q in qs} == {"accept", "alpha"}
    assert len({(q.step, q.test_index) for q in qs}) == len(qs)  # one question per test
    assert any(q.accepted for q in qs if q.kind == "accept") and any(not q.accepted for q in qs if q.kind == "accept")
    for q in qs:
        if q.kind == "accept":
            assert quiz.check_answer(q, q.accepted)[0] and not quiz.check_answer(q, not q.accepted)[0]
            assert ("<" if q.accepted else "≥") in q.reason()  # u against α decides it
        else:
            assert 0.02 < q.alpha < 0.98
            assert quiz.check_answer(q, q.alpha + 0.004)[0]
            assert not quiz.check_answer(q, min(q.alpha + 0.1, 1.0) if q.alpha < 0.9 else q.alpha - 0.1)[0]
            assert "α = p" in q.reason()  # point masses: α is p(x) (or p'(x))


def test_published_figures_carry_their_sources_and_the_eagle_name_is_the_papers():
    assert {t.drafter for t in teaching.TOPOLOGIES} == set(REGISTRY) - {PLAIN}  # every built-in drafter has a card
    for t in teaching.TOPOLOGIES:
        assert t.published and t.source and "20" in t.source  # an author and a year at least
    eagle = next(t for t in teaching.TOPOLOGIES if t.drafter == "eagle2")
    assert "Extrapolation Algorithm for Greater Language-model Efficiency" in eagle.name
    medusa = next(t for t in teaching.TOPOLOGIES if t.drafter == "medusa")
    assert "**no**" in medusa.lossless  # typical acceptance is not lossless
    assert "EAGLE-3" in teaching.EAGLE3_NOTE and "training-time test" in teaching.EAGLE3_NOTE
    for t in teaching.TOPOLOGIES:
        if t.weights:
            assert teaching.shipped_weights_mb(t.weights) > 0.5, f"{t.weights} is not in assets/"


# ---------------------------------------------------------------------------------------------- pages


@pytest.fixture
def app(tiny_model_dir, monkeypatch):
    from app.state import ENV_MODEL

    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    return ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())


def test_the_app_opens_on_the_guided_path_with_a_link_to_every_step(app):
    assert [t.value for t in app.title] == ["Start here"]
    links = [e for e in app.get("page_link")]
    assert len(links) == 10
    sidebar = re.findall(r'st\.Page\("app/pages/\w+\.py", title="([^"]+)"', (Path(APP).parent / "app.py").read_text())
    assert {link.label.removeprefix("Open ") for link in links} | {"Start here"} == set(sidebar)  # every page
    assert len(sidebar) == 11 and "the 11 pages of the sidebar" in app.markdown[0].value
    text = " ".join(m.value for m in app.markdown)
    assert text.count("*Try this:*") == 8


def test_the_topologies_page_compares_and_explains_the_numbers_of_the_run(app, tree_run):
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    at = open_page(app, "app/pages/topologies.py")
    assert [t.value for t in at.title] == ["Topologies compared"]
    labels = {m.label: m.value for m in at.metric}
    numbers = teaching.acceptance_numbers(tree_run)
    assert labels["α (÷ tested)"] == f"{numbers.per_tested:.1%}"
    assert labels["acceptance rate (÷ drafted)"] == f"{numbers.per_drafted:.1%}"
    text = " ".join(m.value for m in at.markdown)
    assert "mean acceptance length" in text and "Extrapolation Algorithm for Greater Language-model Efficiency" in text
    assert "EAGLE-3" in text


def test_the_tree_page_shows_the_rule_applied_beside_the_chain_rule(app, tree_run):
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    at = open_page(app, "app/pages/tree.py")
    assert any(h.value == "How this step was verified" for h in at.header)
    walk = at.dataframe[-1].value
    assert "chain rule on the same x: min(1, p/q)" in walk.columns and "rule applied" in walk.columns
    text = " ".join(m.value for m in at.markdown)
    assert "Why it is lossless" in text and "p′(y) ← p′(y) ÷ (1 − p′(x))" in text
    assert any("largest relative difference" in c.value for c in at.caption)


def test_the_lab_self_check_scores_the_learners_answers(app, tree_run):
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    at = open_page(app, "app/pages/lab.py")
    first = quiz.questions(tree_run, seed=0)[0]
    assert first.kind == "accept"
    wrong = "rejected" if first.accepted else "accepted"
    at.radio(key="quiz_0_0_guess").set_value(wrong)
    ok(at.run())
    at.button(key="quiz_0_0_check").click()
    ok(at.run())
    assert any(e.value.startswith("Not quite") and first.reason() in e.value for e in at.error)
    at.radio(key="quiz_0_0_guess").set_value("accepted" if first.accepted else "rejected")
    ok(at.run())
    at.button(key="quiz_0_0_check").click()
    ok(at.run())
    assert any(s.value.startswith("Right") for s in at.success)
    assert next(m.value for m in at.metric if m.label == "Score") == "1 right, 1 of 6 answered"


def test_the_quiz_counts_every_answer_of_the_sheet(app, tree_run):
    """Six answers read "k right, 6 of 6 answered" (a bare "5 of 6 answered" read as a question left out)."""
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    at = open_page(app, "app/pages/lab.py")
    qs = quiz.questions(tree_run, seed=0)
    assert len(qs) == 6
    for i, q in enumerate(qs):
        if q.kind == "accept":
            at.radio(key=f"quiz_0_{i}_guess").set_value("accepted")
        else:
            at.number_input(key=f"quiz_0_{i}_guess").set_value(round(q.alpha, 4))
        ok(at.run())
        at.button(key=f"quiz_0_{i}_check").click()
        ok(at.run())
    right = sum(q.accepted if q.kind == "accept" else True for q in qs)
    assert next(m.value for m in at.metric if m.label == "Score") == f"{right} right, 6 of 6 answered"


def test_one_q_per_node_on_every_view(app, tree_run):
    """A top-k child has the draft's q but is tested as a point mass: the lab, the tree explorer's node table and
    its verification table all show the node's own q under one name, never None beside a number elsewhere."""
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    step = next(e for e in tree_run if e["type"] == "step" and e["tests"])
    expected = [teaching.q_text(step["nodes"][t["node"]]) for t in step["tests"]]
    assert all(t["q"] is None for t in step["tests"]) and expected[0] != teaching.q_text({"q": None})
    at = open_page(app, "app/pages/tree.py")
    nodes, walk = at.dataframe[0].value, at.dataframe[-1].value
    assert list(nodes[teaching.Q_DRAFT]) == expected == list(walk[teaching.Q_DRAFT])
    for table in (nodes, walk):
        assert not table.isna().any().any() and "None" not in table.astype(str).to_numpy()
    at = open_page(at, "app/pages/lab.py")
    labels = [m.label for m in at.metric]
    assert next(m.value for m in at.metric if m.label == teaching.Q_DRAFT) == expected[0]  # the first tab's test
    assert "q(x) in the test" not in labels and "q(x)" not in labels
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert not any("`" in t or "has no draft distribution" in t for t in titles), titles


def test_the_lab_sandbox_samples_picked_siblings_and_catches_their_bug(app):
    at = open_page(app, "app/pages/lab.py")
    at.radio(key="lab_mode").set_value("picked siblings (top-k of q, point masses)")
    at.select_slider(key="lab_n").set_value(10_000)
    ok(at.run())
    assert float(next(m.value for m in at.metric if m.label == "p-value")) > 0.001
    at.checkbox(key="lab_bug_siblings").check()
    ok(at.run())
    assert float(next(m.value for m in at.metric if m.label == "p-value")) < 0.001


# ------------------------------------------------------------------------------------------- labels and wording


@pytest.fixture(scope="module")
def greedy_tree_run() -> list[dict]:
    """A greedy run (T = 0) of a top-3 tree drafter: siblings are tested in turn, but p is never updated."""
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=1, layers=1, scale=3.0)
    with torch.no_grad():
        events = engine.decode(target, TinyTokenizer(64), TopBTree(draft, b=3, depth=2), PROMPT,
                               decode_settings(max_new_tokens=24, temperature=0.0))
        return [ev.to_dict(e) for e in events]


def test_the_quiz_labels_p_and_alpha_by_the_rule_that_ran(greedy_tree_run, tree_run):
    """At T = 0 a later sibling's test reads the raw p and α is the argmax rule's 0 or 1: no p′, no min(1, p/q)."""
    greedy = quiz.questions(greedy_tree_run, n=100)
    later = [q for q in greedy if any(
        s["step"] == q.step and any(s["nodes"][t["node"]]["parent"] == s["nodes"][s["tests"][q.test_index]["node"]]["parent"]
                                    for t in s["tests"][:q.test_index]) for s in greedy_tree_run if s["type"] == "step")]
    assert later, "the greedy run has no later sibling to label"
    assert all(q.p_label == "p(x), target" and not q.after_rejection for q in greedy)
    assert quiz.alpha_label(True, False) == quiz.alpha_label(True, True) == "α (T = 0: 1 if x is the argmax, else 0)"
    sampled = quiz.questions(tree_run, n=100)
    assert any(q.after_rejection and q.p_label == "p′(x), after the rejected siblings" for q in sampled)
    assert quiz.alpha_label(False, True, True) == "α = p′(x)" and quiz.alpha_label(False, False) == "α = min(1, p/q)"


def test_the_lab_labels_a_greedy_test_by_the_argmax_rule(app, greedy_tree_run):
    app.session_state["trace"], app.session_state["trace_source"] = greedy_tree_run, "test run"
    at = open_page(app, "app/pages/lab.py")
    labels = [m.label for m in at.metric]
    assert "α (T = 0: 1 if x is the argmax, else 0)" in labels
    assert not any("min(1, p/q)" in label or "p′" in label for label in labels)
    # Check yourself at T = 0 asks whether x is the argmax: the target's top tokens are the answer, shown after it
    assert not any("most likely tokens here" in c.value for c in at.caption)
    assert any("what is α?" in m.value and "temperature above 0" in m.value for m in at.markdown)
    first = quiz.questions(greedy_tree_run, seed=0)[0]
    at.radio(key="quiz_0_0_guess").set_value("accepted" if first.accepted else "rejected")
    ok(at.run())
    at.button(key="quiz_0_0_check").click()
    ok(at.run())
    assert sum("most likely tokens here" in c.value for c in at.caption) == 1


def test_the_lab_p_value_says_what_it_can_and_declines_with_too_few_samples(app):
    at = open_page(app, "app/pages/lab.py")
    help_text = next(m.proto.help for m in at.metric if m.label == "p-value")
    assert "at least this large" in help_text and "1 % of the time" in help_text
    assert "they do not." not in help_text  # a p-value below 0.01 is evidence at the 1 % level, not proof
    at.select_slider(key="lab_n").set_value(10)
    ok(at.run())
    assert next(m.value for m in at.metric if m.label == "p-value") == "—"
    assert any("expects fewer than 5" in i.value for i in at.info)


def test_the_teaching_text_quotes_its_sources_as_they_are():
    draft, medusa, eagle = (next(t for t in teaching.TOPOLOGIES if t.drafter == d) for d in ("draft", "medusa", "eagle2"))
    assert "3.4× and 3.1× at T = 0, 2.6× and 2.3× at T = 1" in draft.published  # Leviathan's T5-small rows
    assert "131M" in medusa.overhead and "share the target's LM head" in medusa.overhead
    assert "0.09" in medusa.lossless and "0.3" in medusa.lossless
    assert "MT-bench, HumanEval, GSM8K and Alpaca" in eagle.published
    assert "near-ties" in teaching.GREEDY_IDENTITY and "within hardware numerics" in teaching.GREEDY_IDENTITY
    assert "evaluate_posterior" in teaching.SAFEAILAB_EAGLE
    assert "all or nothing" in teaching.HISTOGRAM_NOTE and "right early and wrong late" in teaching.HISTOGRAM_NOTE


def test_each_live_token_hovers_with_the_test_behind_it(tree_run):
    """Live decoding's hover gives an accepted token its test's p, q, α, u and rule, a replacement the rejection it
    follows, a bonus where it was drawn; the legend says what a bonus means on a tree, not "all drafts accepted"."""
    from app import figures, live_text

    assert "all drafts accepted" not in live_text.legend_html()
    assert "no drafted child" in figures.KIND_LABELS["bonus"]
    seen = set()
    for step in (e for e in tree_run if e["type"] == "step"):
        tests = {t["node"]: t for t in step["tests"]}
        for i, c in enumerate(step["committed"]):
            hover = live_text.token_hover(step, i)
            seen.add(c["kind"])
            if c["kind"] == "accepted":
                test, node = tests[step["accepted_path"][i]], step["nodes"][step["accepted_path"][i]]
                assert f"α = p(x) = {figures.fmt(test['p'])}, u = {figures.fmt(test['u'])}" in hover
                assert f"q(x), the draft's: {figures.fmt(node['q'], 4)} → accepted" in hover
            elif c["kind"] == "replacement":
                assert f"u = {figures.fmt(step['tests'][-1]['u'])}" in hover and "→ rejected" in hover
                assert "this token: drawn from p with the rejected tokens removed" in hover
            elif c["kind"] == "bonus":
                assert "this token: drawn from p" in hover
    assert {"accepted", "replacement"} <= seen
    html = live_text.tokens_html([s for s in tree_run if s["type"] == "step"])
    assert html.count("α = p(x)") >= len([1 for s in tree_run if s["type"] == "step" for c in s["committed"]
                                          if c["kind"] == "accepted"])


def test_the_labels_read_as_their_sources_have_them():
    """Each label as its primary source has it: EAGLE-2's figures from its arXiv v1 abstract (the EMNLP one says up
    to 5×); EAGLE-3 replaces the top-layer feature with layers 2, L/2 and L − 3 (SafeAILab's code); llama.cpp drops
    a draft shorter than --spec-draft-n-min (`result.clear()`), so that step drafts nothing."""
    import argparse

    from specviz.llamacpp import cli

    eagle = next(t for t in teaching.TOPOLOGIES if t.drafter == "eagle2")
    assert "3.05×–4.26×" in eagle.published and "2406.16858v1" in eagle.source and "up to 5×" in eagle.published
    assert "second-to-top layer alone" not in teaching.EAGLE3_NOTE
    assert "Chen et al. write" in teaching.LETTERS_NOTE and "et al. et al." not in teaching.LETTERS_NOTE
    assert "replaces the target's top-layer feature" in teaching.EAGLE3_NOTE and "2, L/2 and L − 3" in teaching.EAGLE3_NOTE
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    serve = parser._subparsers._group_actions[0].choices["llamacpp"]._subparsers._group_actions[0].choices["serve"]
    n_min = next(a for a in serve._actions if "--n-min" in a.option_strings)
    assert "dropped" in n_min.help and "drafts nothing" in n_min.help and "at least" not in n_min.help


def test_both_per_position_acceptances_are_named(app, tree_run):
    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    at = open_page(app, "app/pages/topologies.py")
    text = " ".join(m.value for m in at.markdown)
    assert "**per-position acceptance** (÷ drafts reaching d)" in text
    assert "**per-position acceptance** (÷ every draft)" in text and "num_accepted_tokens_per_pos" in text


def test_plotly_toolbar_keeps_off_the_titles_and_category_labels_stay_level(app, tree_run):
    """The toolbar runs down the right edge (across the top it covered the titles of the tokens-per-step chart,
    the attention mask and the lab's q chart); long category labels break onto lines instead of turning."""
    import plotly.graph_objects as go

    from app import figures

    app.session_state["trace"], app.session_state["trace_source"] = tree_run, "test run"
    for page in ("app/pages/tree.py", "app/pages/lab.py"):
        at = open_page(app, page)
        specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
        assert specs and all(s["layout"].get("modebar", {}).get("orientation") == "v" for s in specs), page
    steps = [e for e in tree_run if e["type"] == "step"]
    assert figures.steps_chart(steps).layout.modebar.orientation == "v"
    bars = figures.level_categories(go.Figure([go.Bar(x=["none", "eagle2:lookup=4"], y=[1, 2]),
                                               go.Box(name="eagle2:lookup=4 / none", y=[1.0, 1.2])]))
    assert bars.layout.xaxis.tickangle == 0 and list(bars.data[0].x) == ["none", "eagle2:lookup=4"]  # data as is
    assert list(bars.layout.xaxis.ticktext) == ["none", "eagle2<br>:lookup=4", "eagle2<br>:lookup=4<br>/ none"]
