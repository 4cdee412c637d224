"""The race's regime controls: which weight sets its lanes run on, the preset that races `none` and the best tree
drafter on both, the clock the lanes replay on (measured here, or a modelled GPU), and the sentence that says
which regime each weight set is in."""
from __future__ import annotations

import streamlit as st

from app import lanes, regimes, state
from specviz import roofline
from specviz.drafters import PLAIN, REGISTRY, drafter_name

MEASURED = "measured here"
CUSTOM = "modelled: custom"
PAYS = "Where speculation pays and where it does not"


def best_tree_drafter(drafters: list[str]) -> str | None:
    """eagle2 where offered, else the first tree drafter."""
    trees = [d for d in drafters if (spec := REGISTRY.get(drafter_name(d))) is not None and spec.tree]
    return "eagle2" if "eagle2" in trees else next(iter(trees), None)


def pays_preset(sets: list[str], drafters: list[str], container) -> None:
    """The preset button: `none` and the best tree drafter, each on every weight set of this model."""
    tree = best_tree_drafter(drafters)
    if len(sets) < 2 or tree is None:
        return
    if container.button(PAYS, key="race_pays", help=f"Races `{PLAIN}` and `{tree}` on {' and '.join(sets)}: the "
                        "same drafter where verifying 8 tokens costs about one forward, and where it does not."):
        st.session_state["race_weights"] = list(sets)
        st.session_state["race_drafters"] = [PLAIN, tree]
        st.session_state["race_started"] = False
        st.rerun()


def lane_regimes(lanes_of: dict, chosen: list[str]) -> lanes.Regimes:
    """Each chosen lane's weights, measured c(8) ÷ c(1) and draft share ({lane: {...}}), for the lanes this
    process decodes."""
    out = {}
    for lane in chosen:
        backend, drafter = lanes_of[lane]
        if not backend.capabilities.bench:
            continue
        spec = REGISTRY.get(drafter_name(drafter or ""))
        share = regimes.part_share(backend.models_here(), spec.needs if spec else None)
        out[lane] = {"weights": backend.weights, "verify_cost_ratio": state.verify_ratio(backend),
                     **({"draft_share": share} if share is not None else {})}
    return out


def clock_choice(container) -> roofline.Roofline | None:
    """The clock the lanes replay on: None for the times measured here, else a modelled GPU (a preset or custom)."""
    names = [MEASURED, *roofline.PRESETS, CUSTOM]
    name = container.selectbox("Clock", names, key="race_clock", help=(
        "Measured here: each step at the time it took on this machine. Modelled: the same steps (tokens verified, "
        "draft forwards) priced by a roofline model of a GPU serving a large target. " + roofline.FORMULA + "."))
    if name == MEASURED:
        return None
    if name != CUSTOM:
        return roofline.PRESETS[name]
    c = container.columns(4)
    params = c[0].number_input("P (billions of parameters)", 0.1, 2000.0, 70.0, key="race_clock_p")
    bytes_per = c[1].number_input("b (bytes a weight)", 0.25, 4.0, 2.0, 0.25, key="race_clock_b")
    bandwidth = c[2].number_input("B (TB/s)", 0.01, 100.0, 3.35, key="race_clock_bw")
    tflops = c[3].number_input("F (dense TFLOP/s)", 0.01, 20000.0, 989.0, key="race_clock_f")
    return roofline.Roofline(CUSTOM, params * 1e9, bytes_per, bandwidth * 1e12, tflops * 1e12)


def why(regimes_of: lanes.Regimes) -> str | None:
    """The regime sentence for the weight sets of a race's lanes, from their measured c(8) ÷ c(1)."""
    ratios = {r["weights"]: r["verify_cost_ratio"] for r in regimes_of.values()
              if r.get("weights") and r.get("verify_cost_ratio") is not None}
    return regimes.regime_sentence(ratios) if ratios else None


def modelled_note(clock: roofline.Roofline, regimes_of: lanes.Regimes) -> str:
    shares = {lane: r["draft_share"] for lane, r in regimes_of.items() if "draft_share" in r}
    return (f"**MODELLED** clock: {clock.describe()}. {roofline.FORMULA}; each draft's share is this pair's part "
            "(its parameters ÷ the target's" + ("" if not shares else ": " + ", ".join(
                f"`{lane}` {share:.3f}" for lane, share in shares.items())) + f"). {roofline.CAVEAT}")
