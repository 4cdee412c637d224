"""A Medusa run with typical acceptance (lossy) at T = 0.8, uploaded on Live decoding and read by every page that
explains tests: nothing crashes, and each test is labelled by the rule that decided it (a threshold on
P = softmax(logits / T), no u, no α; the step's last token P's argmax), never as greedy or as the chain rule."""
import json

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, ok, open_page

from app import figures, quiz, teaching
from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.drafters.medusa import MedusaDrafter
from specviz.models.heads import MedusaHeads

from tiny import TinyTokenizer, decode_settings, tiny_llama

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0)]


@pytest.fixture(scope="module")
def typical_run() -> list[dict]:
    """`medusa:typical=true` at T = 0.8 on tiny models: tokens pass with p of a few percent, some fail, and some
    pass off the kept path."""
    target = tiny_llama(scale=6.0)
    torch.manual_seed(0)
    heads = MedusaHeads(target.config, num_heads=3).eval()
    for p in heads.parameters():
        p.data.normal_(0, 0.3)
    drafter = MedusaDrafter(heads, target, tree=TREE, typical=True)
    with torch.no_grad():
        return [ev.to_dict(e) for e in engine.decode(target, TinyTokenizer(64), drafter, [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6],
                                                     decode_settings(max_new_tokens=32, temperature=0.8, seed=3))]


def steps(events):
    return [e for e in events if e["type"] == "step"]


def test_the_typical_run_names_its_rule_and_has_every_kind_of_test(typical_run):
    for event in typical_run:
        ev.validate(event)
    tests = [t for s in steps(typical_run) for t in s["tests"]]
    assert typical_run[0]["lossy"] and all(t["rule"] == "typical" and t["u"] is None for t in tests)
    assert any(not t["accepted"] for t in tests)
    assert any(t["accepted"] and t["node"] not in s["accepted_path"] for s in steps(typical_run) for t in s["tests"])


@pytest.fixture
def uploaded(tiny_model_dir, monkeypatch, typical_run):
    """The app with the typical trace uploaded on Live decoding, as a user would."""
    from app.state import ENV_MODEL

    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at = open_page(at, "app/pages/live.py")
    data = "".join(json.dumps(e) + "\n" for e in typical_run).encode()
    at.get("file_uploader")[0].upload("typical.jsonl", data, "application/jsonl")
    return ok(at.run())


def test_the_lab_explains_a_typical_test_and_its_quiz_and_sandbox_render(uploaded, typical_run):
    assert any("**lossy**" in w.value for w in uploaded.warning)  # Live decoding says so first
    at = open_page(uploaded, "app/pages/lab.py")  # ok() fails on any exception: the quiz's u formatting crashed
    labels = {m.label: m.value for m in at.metric}
    assert "threshold min(ε, δ·e^−H)" in labels and labels["u"] == "— (no draw: a threshold test)"
    assert not any("min(1, p/q)" in label or "argmax" in label for label in labels)
    first_tested = next(s for s in steps(typical_run) if s["tests"])
    shown = next(m.value for m in at.metric if m.label == "P(x) = softmax(logits / T), target")  # the run tab's
    assert shown == f"{first_tested['tests'][0]['p']:.4f}"
    assert any("typical acceptance (lossy)" in w.value for w in at.warning)
    assert not any("greedy" in str(c.proto) for c in at.get("plotly_chart"))  # the gauge said "greedy: no u"
    assert "p-value" in labels  # the sandbox tab, after the quiz, rendered
    first = quiz.questions(typical_run, seed=0)[0]
    assert first.rule == "typical" and "typical" in first.reason() and first.threshold is not None
    at.radio(key="quiz_0_0_guess").set_value("accepted" if first.accepted else "rejected")
    ok(at.run())
    at.button(key="quiz_0_0_check").click()
    ok(at.run())
    assert any(s.value.startswith("Right") and "P(x) =" in s.value for s in at.success)


def test_the_tree_explorer_labels_typical_tests_by_their_rule(uploaded, typical_run):
    at = open_page(uploaded, "app/pages/tree.py")
    walk = at.dataframe[-1].value
    assert set(walk["rule applied"]) == {teaching.RULE_TEXT["typical"]}
    assert not any("chain rule" in c.value for c in at.caption)
    assert any("typical acceptance (lossy)" in w.value for w in at.warning)
    for step in steps(typical_run):
        if not step["tests"]:
            continue
        fig = figures.step_tree_figure(step)
        hovers = " ".join(h for trace in fig.data for h in (trace.hovertext or []))
        assert "typical (Medusa, lossy)" in hovers and "the target's argmax" not in hovers
        assert "argmax of P = softmax(logits / T)" in hovers and "sampled from q" not in hovers


def test_an_older_typical_trace_without_rules_is_still_read_as_typical(typical_run):
    """Traces written before tests named their rule: the run's lossy flag and temperature decide, and its last
    token (then sampled from p) is not called an argmax."""
    old = [dict(e, tests=[{k: v for k, v in t.items() if k not in ("rule", "threshold")} for t in e["tests"]])
           if e["type"] == "step" else e for e in typical_run]
    for event in old:
        ev.validate(event)
    step = next(s for s in steps(old) if s["tests"])
    assert {r["rule_name"] for r in teaching.verification_walkthrough(step, greedy=False)} == {"typical"}
    assert "argmax" not in figures.final_source(step) and "drawn from p" in figures.final_source(step)
    assert all(q.rule == "typical" for q in quiz.questions(old, n=100))
