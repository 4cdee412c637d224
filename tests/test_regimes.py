"""Both regimes on one machine: the target on two weight sets at once, race lanes that name their weights and
measured c(8) ÷ c(1), the sentence that says which regime each set is in (chosen from the measured numbers), and
the modelled clock (specviz.roofline) against the Cost page's formula.

The app tests inject the tiny model as both weight sets, with verify-cost curves given to them (the numbers a
memory-bound and a compute-bound target measure), so nothing here depends on this host's timings."""
from pathlib import Path

import pytest
import torch
from test_race import ok, race_page

from app import lanes, regimes, state
from specviz import analysis, roofline
from specviz import models as m
from specviz.models import loading
from specviz.models.heads import EagleHead

# seconds of one verify forward over n tokens: flat (memory-bound) on fp32, steep (compute-bound) on q4q8
CURVES = {"fp32": {1: 0.020, 2: 0.0201, 4: 0.0205, 8: 0.0212, 16: 0.024},
          "q4q8": {1: 0.010, 2: 0.013, 4: 0.016, 8: 0.0267, 16: 0.050}}


# ------------------------------------------------------------------------------------------ the regime


def test_the_ratio_and_the_regime_follow_the_curve():
    assert regimes.cost_ratio(CURVES["fp32"]) == pytest.approx(1.06)
    assert regimes.cost_ratio(CURVES["q4q8"]) == pytest.approx(2.67)
    assert regimes.cost_ratio({1: 1.0, 4: 2.0, 12: 4.0}) == pytest.approx(3.0)  # linear between measured sizes
    assert regimes.regime(1.06) == "memory-bound" and regimes.regime(2.67) == "compute-bound"


def test_the_regime_sentence_is_chosen_from_the_measurement():
    said = regimes.regime_sentence({"q4q8": 2.67, "fp32": 1.06})
    q4q8, fp32 = said.split(". On ")
    # the ratio sets the break-even, not the outcome: it says what a step must commit, never that it did
    assert "2.67×" in q4q8 and "compute-bound" in q4q8 and "pays only when it commits more than 2.7 tokens" in q4q8
    assert "1.06×" in fp32 and "memory-bound" in fp32 and "more than 1.1 tokens" in fp32
    assert "almost any acceptance pays" in fp32 and "almost any" not in q4q8
    assert "does not pay" not in said and "pays here" not in said
    # the same weights measured flat on another machine get the other sentence
    assert "memory-bound" in regimes.regime_sentence({"q4q8": 1.1}) and "compute" not in regimes.regime_sentence(
        {"q4q8": 1.1})


def test_lanes_on_weight_sets_take_the_same_weights_none_as_their_baseline():
    names = ["none@q4q8", "eagle2@q4q8", "none@fp32", "eagle2@fp32", "ngram"]
    assert [regimes.baseline_of(n, names) for n in names] == ["none@q4q8", "none@q4q8", "none@fp32", "none@fp32", None]
    assert regimes.split_lane("eagle2:lookup=4@fp32") == ("eagle2:lookup=4", "fp32")
    assert lanes.DRAFTER_NAME.fullmatch("eagle2:lookup=4@fp32") and not lanes.DRAFTER_NAME.fullmatch("eagle2@")


def test_a_drafts_share_counts_its_own_weights_not_the_targets_embedding_it_holds():
    """The shipped draft model holds the target's embedding and LM head as its own submodules (shared tensors, or
    copies in the draft's dtype): its share of the target is its own layers', as an EAGLE head's is."""
    from specviz.models.heads import share_embedding
    from specviz.models.loading import LoadedModels

    from tiny import TinyTokenizer, tiny_llama

    for dtype in (None, torch.bfloat16):
        target, draft = tiny_llama(vocab_size=512, layers=4), tiny_llama(vocab_size=512, layers=1, seed=1)
        share_embedding(draft, target, dtype)
        models = LoadedModels("tiny", target, draft, TinyTokenizer(512), target.device, torch.float32)
        own = sum(p.numel() for name, p in draft.named_parameters()
                  if "embed_tokens" not in name and not name.startswith("lm_head"))
        assert regimes.part_share(models, "draft") == pytest.approx(own / sum(p.numel() for p in target.parameters()))
    head = EagleHead(target.config)  # a head holds no embedding: every weight is its own
    models.parts["eagle"] = head
    assert regimes.part_share(models, "eagle") == pytest.approx(
        sum(p.numel() for p in head.parameters()) / sum(p.numel() for p in target.parameters()))
    models.parts["eagle"] = other = EagleHead(target.config, fc_bias=False)  # computed once per loaded part ...
    assert regimes.part_share(models, "eagle") == pytest.approx(  # ... so a part replaced is counted anew
        sum(p.numel() for p in other.parameters()) / sum(p.numel() for p in target.parameters()))
    assert sum(p.numel() for p in other.parameters()) < sum(p.numel() for p in head.parameters())


def done_run(tau: float, tokens_per_s: float) -> list[dict]:
    return [{"type": "start"}, {"type": "done", "stats": {"tau": tau, "tokens_per_s": tokens_per_s}}]


def test_measured_here_keeps_a_row_per_drafter_and_weight_set():
    settings = object()  # the race's settings: the same for every run here
    cache = {(regimes.RunKey("p", None, settings), lane): done_run(tau, tps) for lane, tau, tps in (
        ("none@q4q8", 1.0, 10.0), ("eagle2@q4q8", 1.5, 8.0), ("none@fp32", 1.0, 4.0), ("eagle2@fp32", 2.0, 6.0))}
    # a race on one weight set names its lanes without weights: its key says which set they ran on
    cache.update({(regimes.RunKey("p", "q4", settings), lane): done_run(tau, tps)
                  for lane, tau, tps in (("none", 1.0, 5.0), ("eagle2", 1.2, 6.0))})
    rows = regimes.measured_in_process(cache)
    assert {lane: (row["drafter"], row["weights"], row["tau"], row["speedup"]) for lane, row in rows.items()} == {
        "eagle2@q4q8": ("eagle2", "q4q8", 1.5, 0.8), "eagle2@fp32": ("eagle2", "fp32", 2.0, 1.5),
        "eagle2@q4": ("eagle2", "q4", 1.2, 1.2)}


# ------------------------------------------------------------------------------------------ the modelled clock


def chain_run(k: int, accepted: list[int]) -> list[dict]:
    """A chain drafter's run (the draft model): every step drafts k tokens and accepts the first accepted[i]."""
    events = [{"type": "start", "drafter": "draft", "options": {"k": k}}]
    for i, a in enumerate(accepted):
        tested = min(a + 1, k)  # a chain stops testing at its first rejection
        events.append({"type": "step", "step": i, "drafted": k, "accepted": a,
                       "nodes": [{"depth": d + 1} for d in range(k)],
                       "tests": [{"accepted": j < a} for j in range(tested)],
                       "committed": [{"kind": "accepted"}] * a + [{"kind": "bonus" if a == k else "replacement"}],
                       "timing": {"elapsed_s": 0.1 * (i + 1), "tokens_per_s": 1.0}})
    tokens = sum(a + 1 for a in accepted)
    stats = {"steps": len(accepted), "tokens_per_s": 1.0, "tau": tokens / len(accepted), "acceptance_rate": None,
             "draft_s": 0.0, "verify_s": 0.0, "new_tokens": tokens}
    return events + [{"type": "done", "stats": stats}]


@pytest.mark.parametrize("clock", list(roofline.PRESETS))
def test_the_modelled_clock_gives_the_cost_pages_speedup_for_the_same_alpha_and_k(clock):
    """α = 0.5, K = 2: steps accepting 0, 0, 1, 2 are E(α, K)'s shares exactly (½, ¼, ¼), so the replay of the run
    at the modelled step costs must give E(α, K) ÷ (step cost in plain forwards)."""
    model = roofline.with_draft_share(roofline.PRESETS[clock], 0.03)
    run = chain_run(2, [0, 0, 1, 2])
    summary = analysis.summarise(run)
    assert summary.alpha == 0.5 and summary.k == 2
    step_cost = model.step_cost(draft_forwards=2, verified=3)
    formula = analysis.predicted_speedup(analysis.expected_tokens_per_step(summary.alpha, summary.k), step_cost)
    plain = 1 / model.forward_s(1)  # `none`: one token per plain forward
    assert roofline.modelled_tokens_per_s(run, model) / plain == pytest.approx(formula, rel=1e-12)


def test_the_modelled_clock_counts_the_draft_forwards_a_step_ran():
    """A step that says how many draft forwards it ran is priced by that (a draft model's dropped tokens, a tree
    whose grafted lookup nodes are deeper than the head went); a trace without the count, by its depth."""
    nodes = [{"depth": 1}, {"depth": 2}]
    assert roofline.draft_forwards({"nodes": nodes, "drafted": 2, "draft_forwards": 4}, "draft") == 4
    assert roofline.draft_forwards({"nodes": nodes + [{"depth": 4}], "draft_forwards": 2}, "eagle2:lookup=4") == 2
    assert roofline.draft_forwards({"nodes": nodes, "drafted": 2}, "draft") == 2
    assert roofline.draft_forwards({"nodes": nodes, "draft_forwards": 0}, "medusa") == 0  # a step the policy skipped
    assert roofline.draft_forwards({"nodes": nodes}, "medusa") == 1 and roofline.draft_forwards({"nodes": nodes}, "ngram") == 0


def test_the_h100_70b_clock_is_memory_bound_and_a_tree_step_costs_about_one_forward():
    model = roofline.PRESETS[roofline.H100_70B]
    assert model.forward_s(1) == pytest.approx(70e9 * 2 / (8 * 3.35e12))  # the Cost page's node: 5.2 ms a token
    assert model.forward_s(16) == model.forward_s(1)  # 16 tokens of arithmetic take less than streaming the weights
    assert model.forward_s(10_000) > model.forward_s(1)  # ... and enough of them do not


# ------------------------------------------------------------------------------------------ the app


@pytest.fixture
def two_regimes(tiny_model_dir, monkeypatch):
    """The tiny model as both weight sets (with itself as draft and a random EAGLE head, so eagle2 races), each
    with its verify-cost curve given; the process-wide models start empty."""
    load = m.load
    loads = []

    def fake(name, weights="auto", **options):
        chosen = "q4q8" if weights == "auto" else weights
        loaded = load(name, **{**options, "draft_model": name, "weights": "fp32"})
        loaded.weights, loaded.verify_curve = chosen, dict(CURVES[chosen])
        torch.manual_seed(0)
        loaded.parts["eagle"] = EagleHead(loaded.target.config).eval()
        loads.append(loaded)
        return loaded

    monkeypatch.setattr(m, "load", fake)
    monkeypatch.setattr(loading, "weight_sets", lambda *args, **kwargs: ["q4q8", "fp32"])
    monkeypatch.setenv(state.ENV_MODEL, str(tiny_model_dir))
    state.st.cache_resource.clear()
    yield loads
    state.st.cache_resource.clear()


def test_the_preset_races_none_and_eagle2_on_both_weight_sets_with_the_reason(two_regimes):
    at = race_page(max_tokens="6")
    at.button(key="race_pays").click()
    ok(at.run())
    assert at.multiselect(key="race_drafters").value == ["none", "eagle2"]
    assert at.multiselect(key="race_weights").value == ["q4q8", "fp32"]
    assert at.query_params["weights"] == "q4q8,fp32"
    at.button(key="race_run").click()
    ok(at.run())
    assert not at.error, [e.value for e in at.error]
    # one process, two weight sets, one tokenizer
    assert [x.weights for x in two_regimes] == ["q4q8", "fp32"] and two_regimes[1].tokenizer is two_regimes[0].tokenizer
    data = lanes.read_race_data(at.get("iframe")[0].proto.srcdoc)
    by_name = {lane["drafter"]: lane for lane in data["lanes"]}
    assert list(by_name) == ["none@q4q8", "eagle2@q4q8", "none@fp32", "eagle2@fp32"]
    assert by_name["eagle2@fp32"]["label"] == "fp32 · c(8)/c(1) 1.06 (memory-bound)"
    assert by_name["eagle2@q4q8"]["label"] == "q4q8 · c(8)/c(1) 2.67 (compute-bound)"
    assert by_name["eagle2@fp32"]["baseline"] == "none@fp32" and by_name["eagle2@q4q8"]["baseline"] == "none@q4q8"
    assert data["clock"] == "measured" and data["one_run"]
    reason = next(i.value for i in at.info if "Why the lanes differ by weights" in i.value)
    assert "2.67×" in reason and "more than 2.7 tokens" in reason and "1.06×" in reason and "almost any" in reason
    table = at.dataframe[0].value
    assert list(table["c(8)/c(1)"]) == [2.67, 2.67, 1.06, 1.06]
    assert list(table["weights"]) == ["q4q8", "q4q8", "fp32", "fp32"]
    assert any("one run of each lane" in c.value for c in at.caption)


def test_a_race_on_another_single_weight_set_decodes_anew(two_regimes):
    """On one weight set the lanes' names carry no weights: the runs kept for a q4q8 race are not replayed as the
    fp32 race's."""
    at = race_page(drafters="none", max_tokens="4")
    assert at.multiselect(key="race_weights").value == ["q4q8"]
    at.button(key="race_run").click()
    ok(at.run())
    at.multiselect(key="race_weights").set_value(["fp32"])
    ok(at.run())
    assert at.button(key="race_run").label == "Run the race (1 to decode)"
    at.button(key="race_run").click()
    ok(at.run())
    assert sorted((key.weights, lane) for key, lane in at.session_state["race_cache"]) == [("fp32", "none"),
                                                                                       ("q4q8", "none")]
    at.multiselect(key="race_weights").set_value(["q4q8"])
    ok(at.run())
    assert at.button(key="race_run").label == "Run the race (replay)"  # the q4q8 run is still kept


def test_the_url_names_the_weights_and_a_modelled_clock_says_so(two_regimes):
    at = race_page(drafters="none,ngram", weights="fp32,q4q8,fp16", max_tokens="5")
    assert at.multiselect(key="race_weights").value == ["fp32", "q4q8"]
    assert any("weights fp16" in w.value for w in at.warning)
    at.selectbox(key="race_clock").set_value(roofline.H100_70B)
    at.button(key="race_run").click()
    ok(at.run())
    data = lanes.read_race_data(at.get("iframe")[0].proto.srcdoc)
    assert [lane["drafter"] for lane in data["lanes"]] == ["none@fp32", "ngram@fp32", "none@q4q8", "ngram@q4q8"]
    assert data["clock"] == "MODELLED" and roofline.FORMULA in data["clock_note"] and "not a large target" in data[
        "clock_note"]
    assert all(lane["label"].endswith("· MODELLED clock: c(8)/c(1) 1.00") for lane in data["lanes"])
    none = next(lane for lane in data["lanes"] if lane["drafter"] == "none@fp32")
    # `none` on the modelled clock: one 70B forward a token, whatever this host measured
    assert none["tokens_per_s"] == pytest.approx(1 / roofline.PRESETS[roofline.H100_70B].forward_s(1))
    assert any("MODELLED" in w.value and "not a large target" in w.value for w in at.warning)


def test_the_sidebar_names_the_weights_every_page_runs_on(two_regimes):
    at = race_page()
    assert at.sidebar.selectbox(key="sb_weights").value == "q4q8"
    assert any("4-bit weights, 8-bit activations" in c.value for c in at.sidebar.caption)
    at.sidebar.selectbox(key="sb_weights").set_value("fp32")
    at.switch_page("app/pages/live.py")
    ok(at.run())
    assert any("(float32; fp32 weights)" in c.value for c in at.sidebar.caption)
    at.sidebar.slider(key="sb_max_new").set_value(4)
    at.button(key="live_run").click()
    ok(at.run())
    assert not at.error, [e.value for e in at.error]
    assert [x.weights for x in two_regimes] == ["q4q8", "fp32"]  # the live run loaded the fp32 set beside q4q8


# ------------------------------------------------------------------------------------------ the bench


def tiny_sets() -> dict:
    """Two weight sets of one tiny model (the same weights under two names: a test double), one tokenizer."""
    import torch

    from specviz.models.loading import LoadedModels

    from tiny import TinyTokenizer, tiny_llama

    tokenizer, out = TinyTokenizer(64), {}
    for weights in ("q4q8", "fp32"):
        target, draft = tiny_llama(scale=3.0), tiny_llama(seed=0, layers=2, scale=2.0)
        out[weights] = LoadedModels("tiny", target, draft, tokenizer, target.device, torch.float32, weights=weights)
    return out


def test_the_bench_runs_every_drafter_on_each_weight_set_in_one_interleaved_run():
    from specviz import bench
    from specviz.bench import regimes as bench_regimes

    prompts = [bench.Prompt("a", "abc abc abc abc"), bench.Prompt("b", "the cat sat on the mat. the cat")]
    settings = bench.quick_settings(drafters=("ngram", "draft"), max_new_tokens=8, verify_sizes=(1, 2), cost_repeats=1,
                                    bandwidth_mb=8, bandwidth_repeats=1, context_len=16)
    order = []
    report = bench_regimes.run_regimes(tiny_sets(), prompts, settings, lambda d, t, label: order.append(label))
    assert list(report["methods"]) == [f"{d}@{w}" for w in ("q4q8", "fp32") for d in ("none", "ngram", "draft")]
    # interleaved: prompt a's six decodes, then prompt b's, in a rotated order
    decodes = [label for label in order if "·" in label]
    assert [label.split(" · ")[0] for label in decodes] == ["a"] * 6 + ["b"] * 6
    assert decodes[0].endswith("none@q4q8") and decodes[6].endswith("ngram@q4q8")
    for name, method in report["methods"].items():
        assert method["speedup_vs_none_same_weights"]["n"] == 2 and method["outputs_match_none"] is True
        if name.startswith("none@"):
            assert method["speedup_vs_none_same_weights"]["median"] == 1.0
    assert report["methods"]["none@q4q8"]["speedup_vs_first_none"]["median"] == 1.0
    for w, s in report["weight_sets"].items():  # c(8) is measured on each set whatever --verify-sizes says
        tree = s["verify_cost_ms"]["tree"]
        assert set(tree) == {"1", "2", "8"} and s["c8_over_c1"] == pytest.approx(tree["8"] / tree["1"])
        assert s["regime"] == regimes.regime(s["c8_over_c1"])
    text = bench_regimes.to_markdown(report)
    assert "## The regime of each weight set" in text and "speedup vs none@q4q8" in text and "`draft@fp32`" in text


def test_the_bench_runs_both_draft_length_policies_on_each_weight_set():
    """--weights with --k-policy cost,fixed: every drafter under each policy on each set."""
    from specviz import bench
    from specviz.bench import regimes as bench_regimes

    settings = bench.quick_settings(drafters=("ngram",), k_policies=("cost", "fixed"), max_new_tokens=4,
                                    verify_sizes=(1, 2), cost_repeats=1, bandwidth_mb=8, bandwidth_repeats=1,
                                    context_len=16)
    report = bench_regimes.run_regimes(tiny_sets(), [bench.Prompt("a", "abc abc abc abc")], settings)
    assert list(report["methods"]) == [f"{d}@{w}" for w in ("q4q8", "fp32")
                                       for d in ("none", "ngram:k_policy=cost", "ngram:k_policy=fixed")]


def test_the_bench_takes_several_weight_sets_and_refuses_unknown_ones(capsys):
    from specviz.bench.cli import build_bench_parser

    parser = build_bench_parser()
    assert parser.parse_args(["--weights", "q4q8, fp32"]).weights == "q4q8,fp32"
    assert parser.parse_args([]).weights == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--weights", "q4q8,fp16"])
    assert "several weight sets" in capsys.readouterr().err


def test_why_it_works_shows_both_curves_and_the_sentence_the_measurement_chose(two_regimes):
    at = race_page()
    at.switch_page("app/pages/overview.py")
    ok(at.run())
    at.button(key="ov_regimes").click()
    ok(at.run())
    assert not at.error, [e.value for e in at.error]
    chart = next(c for c in at.get("plotly_chart") if "verify cost" in c.proto.spec)
    assert '"name":"q4q8 (' in chart.proto.spec and '"name":"fp32 (' in chart.proto.spec
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["c(8) ÷ c(1), q4q8"] == "2.67" and metrics["c(8) ÷ c(1), fp32"] == "1.06"
    assert metrics["Copy bandwidth (measured)"].endswith("GB/s")
    said = [i.value for i in at.info if "a verify of 8 tokens costs" in i.value]
    assert said == [regimes.regime_sentence({"q4q8": 2.67, "fp32": 1.06})]


def test_the_tree_explorer_says_why_auto_keeps_small_trees_and_offers_a_fixed_budget(two_regimes):
    at = race_page()
    at.sidebar.selectbox(key="sb_drafter").set_value("eagle2")
    at.sidebar.slider(key="sb_max_new").set_value(6)
    at.switch_page("app/pages/tree.py")
    ok(at.run())
    at.button(key="tree_run").click()
    ok(at.run())
    assert not at.error, [e.value for e in at.error]
    trace = at.session_state["trace"]
    nodes = sorted(len(s["nodes"]) for s in trace if s["type"] == "step")
    assert trace[0]["options"]["total_tokens"] == "auto"
    said = [i.value for i in at.info if "`total_tokens auto` kept" in i.value]  # the sidebar's default: auto
    assert nodes[len(nodes) // 2] <= 4  # a random head's chances do not pay for 8 tokens at 2.67× one
    assert len(said) == 1 and "costs 2.67× one" in said[0] and "(26.7 ms against 10.0 ms, compute-bound)" in said[0]
    assert "verify over 17 tokens costs" in said[0]
    at.button(key="tree_fixed").click()
    ok(at.run())
    fixed = at.session_state["trace"]
    assert fixed[0]["options"]["total_tokens"] == 16 and "total_tokens = 16" in at.session_state["trace_source"]
    assert max(len(s["nodes"]) for s in fixed if s["type"] == "step") > 4
    assert not [i.value for i in at.info if "kept" in i.value and "nodes a step" in i.value]  # fixed: no note


# ------------------------------------------------------------------------------------------ "measured here"


def test_measured_here_means_this_process_and_the_cost_page_starts_at_the_best_run(two_regimes):
    at = race_page()
    at.switch_page("app/pages/topologies.py")
    ok(at.run())
    labels = [m.label for m in at.metric]
    assert "measured here: τ" not in labels  # no run of this process yet: nothing is "measured here"
    assert all(label.startswith("shipped report, ") and "-core" in label for label in labels)

    at.switch_page("app/pages/race.py")
    ok(at.run())
    at.multiselect(key="race_drafters").set_value(["none", "draft", "ngram"])  # the tiny model drafts for itself
    at.number_input(key="race_max_new").set_value(8)
    ok(at.run())
    at.button(key="race_run").click()
    ok(at.run())
    at.switch_page("app/pages/topologies.py")
    ok(at.run())
    here = [m for m in at.metric if m.label == "measured here on q4q8: τ"]  # the race's one weight set
    assert len(here) == 2 and all("This process's race run" in m.help for m in here)

    at.switch_page("app/pages/cost.py")
    ok(at.run())
    alphas = {name: analysis.summarise(e).alpha or 0.0 for (_, name), e in at.session_state["race_cache"].items()
              if name != "none"}
    best = max(alphas, key=alphas.get)
    assert at.selectbox(key="cost_spec").value.startswith(f"race: {best} ")  # the best α, not the first or last
    assert at.selectbox(key="cost_b_alpha_source").value.startswith(f"race: {best} ")


# ------------------------------------------------------------------------------------------ the reference race


def test_the_reference_race_loads_in_one_click_and_says_where_it_was_measured(tiny_model_dir, monkeypatch, tmp_path):
    import specviz.paths
    from specviz.backends.local import LocalBackend
    from specviz.decoding.settings import DecodeSettings

    shared = LocalBackend(m.load(str(tiny_model_dir), draft_model=str(tiny_model_dir), device="cpu"))
    runs = {f"{d}@{w}": shared.run("Count: one two three one two three", drafter=d,
                                   settings=DecodeSettings(max_new_tokens=6))
            for w in ("q4q8", "fp32") for d in ("none", "draft")}
    ratios = {"q4q8": 2.67, "fp32": 1.06}
    regimes_of = {lane: {"weights": lane.split("@")[1], "verify_cost_ratio": ratios[lane.split("@")[1]]} for lane in runs}
    about = {"machine": "Test CPU, 2 cores", "date": "2026-12-06T00:00:00+00:00", "command": "python x.py",
             "median_of": 3}
    (tmp_path / "race-regimes.zip").write_bytes(lanes.write_bundle(runs, regimes_of, about))
    monkeypatch.setattr(specviz.paths, "ASSETS", tmp_path)
    monkeypatch.setenv(state.ENV_MODEL, "/no/such/model")  # no model needed to replay it
    at = race_page()
    at.button(key="race_reference").click()
    ok(at.run())
    data = lanes.read_race_data(at.get("iframe")[0].proto.srcdoc)
    assert [lane["drafter"] for lane in data["lanes"]] == list(runs) and not data["one_run"]
    assert data["lanes"][1]["label"] == "q4q8 · c(8)/c(1) 2.67 (compute-bound)"
    assert any("Test CPU, 2 cores" in c.value and "python x.py" in c.value for c in at.caption)
    assert any("median of 3 decodes" in c.value for c in at.caption)
    assert any("more than 2.7 tokens" in i.value and "almost any acceptance pays" in i.value for i in at.info)
    at.button(key="race_reference_off").click()
    ok(at.run())
    assert not at.get("iframe")


SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "race-regimes.zip"


@pytest.mark.skipif(not SHIPPED.is_file(), reason="no reference race shipped")
def test_the_shipped_reference_race_is_small_and_says_how_it_was_made():
    data = SHIPPED.read_bytes()
    assert len(data) < 2**20
    runs = lanes.read_bundle(data, SHIPPED.name)
    regimes_of, about = lanes.bundle_about(data)
    assert list(runs) == ["none@q4q8", "eagle2@q4q8", "none@fp32", "eagle2@fp32"]
    assert {"machine", "date", "command", "median_of"} <= set(about) and "reference_race.py" in about["command"]
    assert {r["weights"] for r in regimes_of.values()} == {"q4q8", "fp32"}
    assert all(r["verify_cost_ratio"] > 0 for r in regimes_of.values())
    for lane, events in runs.items():  # each lane's text is its weight set's none's (greedy)
        assert events[-1]["token_ids"] == runs[regimes.baseline_of(lane, list(runs))][-1]["token_ids"]


# ------------------------------------------------------------------------------------------ in a browser


@pytest.mark.slow
def test_the_race_document_replays_both_regimes_and_a_modelled_clock_in_chromium(tiny_model_dir, tmp_path):
    """The exported document in a real browser: lanes named by weights with their labels, bars over each set's own
    `none`, MODELLED with its formula where the clock is modelled; no script error."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_browser import CHROMIUM, open_browser
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium")
    from specviz.backends.local import LocalBackend
    from specviz.decoding.settings import DecodeSettings

    shared = LocalBackend(m.load(str(tiny_model_dir), draft_model=str(tiny_model_dir), device="cpu"))
    runs = {f"{d}@{w}": shared.run("Count: one two three one two three", drafter=d,
                                   settings=DecodeSettings(max_new_tokens=6))
            for w in ("q4q8", "fp32") for d in ("none", "draft")}
    regimes_of = {lane: {"weights": lane.split("@")[1], "verify_cost_ratio": 2.67 if "q4q8" in lane else 1.06,
                         "draft_share": 0.03} for lane in runs}
    clock = roofline.PRESETS[roofline.H100_70B]
    with sync_api.sync_playwright() as pw:
        browser, page = open_browser(pw)
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        for modelled in (None, clock):
            data = lanes.race_data(lanes.build_lanes(runs, regimes_of, modelled), prompt="p", temperature=0.0,
                                   max_new_tokens=6, note="n", clock=modelled)
            path = tmp_path / f"race-{bool(modelled)}.html"
            path.write_text(lanes.race_document(data))
            page.goto(path.as_uri())
            page.click("#race-play")  # pause the autoplay, then jump to the end step by step
            for _ in range(40):
                page.click("#race-next")
            labels = page.locator(".lane-label").all_inner_texts()
            assert labels[1].startswith("q4q8 · c(8)/c(1) 2.67 (compute-bound)")
            assert labels[3].startswith("fp32 · c(8)/c(1) 1.06 (memory-bound)")
            bars = dict(zip(page.locator(".bar-name").all_inner_texts(), page.locator(".bar-value").all_inner_texts()))
            assert bars["none@q4q8"] == bars["none@fp32"] == "1.00×"  # each set over its own none
            title = page.locator(".bars h4").inner_text()
            assert ("MODELLED" in title) == (modelled is not None) and "one run of each lane" in title
            notes = " ".join(page.locator(".note").all_inner_texts())
            assert (roofline.FORMULA in notes) == (modelled is not None)
        browser.close()
    assert not errors, errors
