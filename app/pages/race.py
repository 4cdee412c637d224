import os
import re
from dataclasses import replace

import plotly.graph_objects as go
import streamlit as st

from app import clocks, figures, lanes, live_text, regimes, state, teaching
from specviz import analysis as measures
from specviz.backends import open_backend
from specviz.drafters import PLAIN
from specviz.errors import SpecvizError
from specviz.paths import ASSETS

TRUE = ("1", "true", "yes", "on")
REFERENCE = ASSETS / "race-regimes.zip"  # the reference race: scripts/reference_race.py (assets/README.md)
# Presenter mode: the sidebar and Streamlit's header hidden, the page's type larger.
PRESENTER_CSS = """<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"] { display: none !important; }
[data-testid="stMainBlockContainer"] { font-size: 1.3rem; max-width: 100%; padding-top: 1.5rem; }
</style>"""


@st.cache_resource(show_spinner=False)
def finished_runs() -> lanes.RunStore:
    """Finished race runs of every browser session of this server, keyed by all a run depends on (seed included)."""
    return lanes.RunStore()


ENV_LANE = "SPECVIZ_RACE_BACKEND"  # an engine's address (vllm+http://..., llama+http://...) whose lane the race offers


def other_engine():
    """Another engine to race beside this model, from the page's address field (it starts at
    $SPECVIZ_RACE_BACKEND), or None. Its lane runs the drafter it drafts with by default (a vLLM server or a
    llama-server: the method it was started with) and shows what its events carry (theirs: committed tokens and the
    drafted and accepted counts per verify step, no tree)."""
    with st.expander("Another engine's lane", expanded=bool(st.session_state.get("race_engine"))):
        st.session_state.setdefault("race_engine", os.environ.get(ENV_LANE, ""))
        address = st.text_input("Engine address (vllm+http://host:port for a vLLM server started as docs/vllm.md "
                                "says, llama+http://host:port for a llama-server as docs/llamacpp.md says, on the "
                                "same model)", key="race_engine").strip()
        if not address:
            return None
        try:
            return engine_at(address)
        except SpecvizError as err:
            st.error(str(err))
            return None


@st.cache_resource(show_spinner=False, ttl=30)
def engine_at(address: str):
    return open_backend(address, token=os.environ.get(state.ENV_BACKEND_TOKEN))


def plain(text: str) -> str:
    """Text from the URL shown in a Markdown message as itself: no links, emphasis or code from it."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$])", r"\\\1", text)


def url_number(name: str, cast, low, high, problems: list[str]):
    """The URL parameter `name` as a number in [low, high], or None (with a message) when it is not one."""
    raw = st.query_params.get(name)
    if raw is None:
        return None
    try:
        value = cast(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        problems.append(f"{name}={plain(raw)} (a number from {low} to {high})")
        return None
    return value


def prefill_from_url(drafters: list[str], sets: list[str]) -> None:
    """Once per session: the race settings of the URL into the page's fields, so a bookmark opens a prepared race
    (weights=q4q8,fp32: each drafter raced on each weight set)."""
    if st.session_state.get("race_url_read"):
        return
    st.session_state["race_url_read"] = True
    qp, problems = st.query_params, []
    if "weights" in qp:
        asked = [w.strip() for w in qp["weights"].split(",") if w.strip()]
        if unknown := [w for w in asked if w not in sets]:
            problems.append(f"weights {plain(', '.join(unknown))} (this model runs on {', '.join(sets)} here)")
        st.session_state["race_weights"] = [w for w in asked if w in sets] or sets[:1]
    if "prompt" in qp:
        st.session_state["race_prompt"] = qp["prompt"]
    if "drafters" in qp:
        asked = [d.strip() for d in qp["drafters"].split(",") if d.strip()]
        unknown = [d for d in asked if d not in drafters]
        if unknown:
            problems.append(f"drafters {plain(', '.join(unknown))} (this model offers {', '.join(drafters)})")
        st.session_state["race_drafters"] = [d for d in asked if d in drafters]
    for name, key, cast, low, high in (("seed", "race_seed", int, 0, 2**31 - 1),
                                       ("temperature", "race_temperature", float, 0.0, 2.0),
                                       ("max_tokens", "race_max_new", int, 1, 256)):
        value = url_number(name, cast, low, high, problems)
        if value is not None:
            st.session_state[key] = value
    if problems:
        st.warning("Left out of the link's settings: " + "; ".join(problems) + ".")


def follow_sidebar(settings: state.Settings) -> None:
    """The race's temperature and seed start at the sidebar's (or the URL's) and follow the sidebar's changes."""
    side = (settings.temperature, settings.seed)
    changed = "race_side" in st.session_state and st.session_state["race_side"] != side
    for key, value in zip(("race_temperature", "race_seed"), side):
        if changed or key not in st.session_state:
            st.session_state[key] = value
    st.session_state["race_side"] = side


def write_url(prompt: str, chosen: list[str], temperature: float, seed: int, max_new: int, presenter: bool,
              weights: list[str] | None = None) -> None:
    """The race's settings in the address bar: bookmarking the page keeps the race."""
    st.query_params.from_dict({"prompt": prompt, "drafters": ",".join(chosen), "seed": str(seed),
                               "temperature": f"{temperature:g}", "max_tokens": str(max_new),
                               **({"weights": ",".join(weights)} if weights else {}),
                               **({"presenter": "1"} if presenter else {})})


def load_bundle(box) -> tuple[str, dict[str, list[dict]], lanes.Regimes, dict] | None:
    """A race bundle uploaded in `box`, or the reference race shipped in assets/ once its button is pressed: (its
    name, {lane: events}, each lane's weights and c(8) ÷ c(1), where it was measured), or None (with the error
    shown)."""
    upload = box.file_uploader("A race bundle (.zip, as downloaded below a race)", type=["zip"], key="race_upload")
    if upload is None and REFERENCE.is_file():
        box.button("Load the reference race (both regimes; it says where and when it was measured)", key="race_reference",
                   on_click=lambda: st.session_state.update(race_use_reference=True))
    if upload is None and not st.session_state.get("race_use_reference"):
        return None
    name = figures.md_code(upload.name) if upload is not None else f"`{REFERENCE.name}`"  # Markdown: no links
    data = upload.getvalue() if upload is not None else REFERENCE.read_bytes()
    try:
        return name, lanes.read_bundle(data, name), *lanes.bundle_about(data)
    except SpecvizError as err:
        box.error(f"Could not load the race bundle: {err}")
        return None


def other_engines(runs: dict[str, list[dict]]) -> dict[str, str]:
    """The lanes another engine decoded (a vLLM or llama.cpp lane beside ours): {lane: its engine}."""
    ours = (runs.get(PLAIN) or next(iter(runs.values())))[0].get("engine", "specviz")
    return {name: events[0].get("engine", "specviz") for name, events in runs.items()
            if events[0].get("engine", "specviz") != ours}


def show_race(runs: dict[str, list[dict]], where: str, presenter: bool, regimes_of: lanes.Regimes | None = None,
              clock=None, about: dict | None = None) -> None:
    """The lanes replayed together, the downloads and (outside presenter mode) the analysis. regimes_of: each lane's
    weights and measured c(8) ÷ c(1); clock: a modelled clock (specviz.roofline.Roofline) or None (measured);
    about: where a loaded bundle was measured (machine, date, command)."""
    regimes_of = regimes_of or {}
    start = next(iter(runs.values()))[0]
    temperature = lanes.temperature_of(runs)
    elsewhere = other_engines(runs)
    note = (f"The runs were decoded one after another {where}"
            + "".join(f", {n} on {teaching.ENGINE_NAMES.get(e, e)}'s server (timed as its client waits)"
                      for n, e in elsewhere.items())  # plain text: the document shows it as it is
            + "; the lanes replay them on one clock, each step's tokens appearing at the time measured for it since "
            "its own run began (timing.elapsed_s). Lanes decoding truly at the same moment would need one engine "
            "worker per lane, and the engine runs one decode at a time per device.")
    data = lanes.race_data(lanes.build_lanes(runs, regimes_of, clock), prompt=start["prompt_text"],
                           temperature=temperature, max_new_tokens=max(e[0]["max_new_tokens"] for e in runs.values()),
                           note=note, presenter=presenter, clock=clock, one_run=not (about or {}).get("median_of"))
    if (reason := clocks.why(regimes_of)) is not None:
        several = len({r.get("weights") for r in regimes_of.values()}) > 1
        st.info(f"**{'Why the lanes differ by weights' if several else 'The regime these lanes ran in'}:** {reason}")
    if clock is not None:
        kept = [name for name, events in runs.items() if not lanes.modelled(events)]
        st.warning(clocks.modelled_note(clock, regimes_of) + ("" if not kept else " " + ", ".join(
            f"`{name}`" for name in kept) + f" keep{'s' if len(kept) == 1 else ''} the time measured as "
            "decoded, with no speedup over a modelled `none`: a modelled clock replays only specviz's own steps "
            "in full detail (their trees or chains), and these carry no more than the tokens drafted and accepted."))
    for lane in data["lanes"]:  # another engine's text is compared below, for information, not marked as ours is
        if lane["drafter"] in elsewhere:
            lane["same_as_none"] = None
    document = lanes.race_document(data)
    st.iframe(document, height="content", alt="The race's lanes, replayed at their "
              + ("MODELLED" if clock is not None else "measured") + " timings")
    if presenter:
        return
    if temperature == 0 and PLAIN in runs:
        differ = [lane["drafter"] for lane in data["lanes"] if lane["same_as_none"] is False]
        if differ:
            st.warning("At temperature 0 a lane may part from `none`'s text only at a floating-point near-tie of the "
                       "target's two most likely tokens; anything else is a failed drafter. Where each parted, with "
                       "the target's top tokens there as `none` saw them (a near-tie shows two almost equal p):")
            for name in differ:
                found = lanes.first_difference(runs[PLAIN], runs[name])
                top = ", ".join(f"{figures.md_code(t[1])} {t[2]:.6f}" for t in found["top"][:3])
                st.markdown(f"- `{name}`: token {found['index']} (id {found['got']} instead of `none`'s "
                            f"{found['none']}); the target's top tokens there: {top or 'not recorded'}.")
            st.caption("`python -m specviz bench` tells the two apart: it recomputes the target's logits at such a "
                       "token and reports a near-tie as a numerics event (*Benchmarks* page).")
        elif len(runs) > len(elsewhere) + 1 or not elsewhere:
            st.success(f"Temperature 0: every lane{' decoded here' if elsewhere else ''} produced exactly the same "
                       "text as `none`, as greedy verification promises up to floating-point near-ties.")
        for name, engine in elsewhere.items():
            found = lanes.first_difference(runs[PLAIN], runs[name])
            st.info(teaching.other_engine_note(name, engine) + (
                " Its text is `none`'s, token for token." if found is None else
                f" It parted from `none`'s at token {found['index']} (id {found['got']} instead of {found['none']})."))
    elif temperature == 0:
        st.info("Add `none` to the drafters to check that every lane produces its text (at temperature 0 it must).")
    else:
        st.info(f"Temperature {temperature:g}: each lane is a different sample of the same distribution (the "
                "target's p); the texts differ, their distribution does not"
                + (" (a lane on another engine samples its own copy of the model)." if elsewhere else "."))
    c1, c2 = st.columns(2)
    c1.download_button("Download the race (HTML, replays offline)", document, file_name="specviz-race.html",
                       mime="text/html", key="race_dl_html")
    c2.download_button("Download the trace bundle (zip: one JSONL trace per lane)",
                       lanes.write_bundle(runs, regimes_of, about),
                       file_name="specviz-race-bundle.zip", mime="application/zip", key="race_dl_bundle")
    analysis(runs, temperature, where, regimes_of, (about or {}).get("median_of"))


def analysis(runs: dict[str, list[dict]], temperature: float, where: str, regimes_of: lanes.Regimes,
             median_of: int | None = None) -> None:
    first = next(iter(runs))
    base = runs.get(regimes.baseline_of(first, list(runs)) or PLAIN)
    base_tps = state.done_of(base)["stats"]["tokens_per_s"] if base else None
    rows = []
    for name, events in runs.items():
        stats = state.done_of(events)["stats"]
        own = runs.get(regimes.baseline_of(name, list(runs)) or "")
        rows.append({
            "lane": name,
            "weights": regimes_of.get(name, {}).get("weights"),
            "c(8)/c(1)": (None if (ratio := regimes_of.get(name, {}).get("verify_cost_ratio")) is None
                          else round(ratio, 2)),
            "tokens": stats["new_tokens"],
            "steps": stats["steps"],
            "τ (tokens/step)": round(stats["tau"], 2),
            "acceptance": None if stats["acceptance_rate"] is None else round(stats["acceptance_rate"], 3),
            "tokens/s": round(stats["tokens_per_s"], 2),
            "speedup vs none (same weights)": round(stats["tokens_per_s"] / state.done_of(own)["stats"]["tokens_per_s"],
                                                    2) if own else None,
            **({f"speedup vs {regimes.baseline_of(first, list(runs))}": round(stats["tokens_per_s"] / base_tps, 2)}
               if base_tps and "@" in first else {}),
            "draft s": round(stats["draft_s"], 2),
            "verify s": round(stats["verify_s"], 2),
            "same text as none (greedy)": (state.done_of(events)["token_ids"] == state.done_of(own)["token_ids"])
            if own and temperature == 0 else None,
        })
    st.subheader("Results")
    st.dataframe(rows, hide_index=True)
    elsewhere = other_engines(runs)
    st.caption(f"Speedup = tokens/s ÷ tokens/s of `none`, measured {where}"
               + "".join(f"; `{n}` on {teaching.ENGINE_NAMES.get(e, e)}'s server, as its client waits (its draft "
                         "and verify time are not told apart)" for n, e in elsewhere.items())
               + ". At temperature 0 every drafter produces `none`'s text up to floating-point near-ties (*Why it "
               "works* says why). " + ("" if base else "Add `none` to the drafters to get speedups.")
               + (f" Each lane is the median of {median_of} decodes by tokens/s, measured when the bundle was made."
                  if median_of else " Each figure is one run of each lane, not a median over several: on a shared "
                  "host a rerun moves it (*Decode every lane again* measures anew; the bench takes medians over "
                  "prompts)."))

    st.subheader("Which tokens each step produced")
    cols = st.columns(min(len(runs), 2))
    for i, (name, events) in enumerate(runs.items()):
        cols[i % len(cols)].plotly_chart(figures.race_timeline(name, state.steps_of(events)), key=f"race_tl_{name}")
    st.html(live_text.legend_html())

    st.subheader("Where the time goes")
    st.plotly_chart(figures.timing_breakdown({n: state.steps_of(e) for n, e in runs.items()}), key="race_timing")

    c1, c2 = st.columns(2)
    fig = go.Figure(go.Bar(x=list(runs), y=[state.done_of(e)["stats"]["tokens_per_s"] for e in runs.values()],
                           marker_color="#1f77b4"))
    fig.update_layout(title="tokens/s (measured)", height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    c1.plotly_chart(fig, key="race_tps")
    fig = go.Figure()
    for name, events in runs.items():
        per_position = state.done_of(events)["stats"]["per_position_acceptance"]
        if per_position:
            fig.add_trace(go.Scatter(x=list(range(1, len(per_position) + 1)), y=per_position, mode="lines+markers",
                                     name=name))
    fig.update_layout(title="per-position acceptance", height=300, xaxis={"title": "depth d", "dtick": 1},
                      yaxis={"range": [0, 1.05], "title": "steps accepting at d ÷ steps reaching d"},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    c2.plotly_chart(fig, key="race_pos")
    histograms = {name: figures.step_histogram(state.steps_of(events), state.done_of(events))
                  for name, events in runs.items()}
    if any(histograms.values()):
        nothing = {name: measures.drafted_nothing(state.steps_of(events)) for name, events in runs.items()}
        st.plotly_chart(figures.acceptance_histogram_figure(
            {n: h for n, h in histograms.items() if h}, "acceptance histogram (share of each lane's drafting steps)",
            no_draft=nothing), key="race_histogram")
        st.caption(teaching.HISTOGRAM_NOTE + " Counts per lane (steps accepting 0, 1, 2, …; then the steps that "
                   "drafted nothing): " + "; ".join(f"`{n}` {', '.join(map(str, h))}; {nothing[n]} drafted nothing"
                                                    for n, h in histograms.items() if h) + ".")

    pick = st.selectbox("Open one run in the tree explorer and the lab", list(runs), key="race_pick")
    if st.button("Use this run", key="race_use"):
        state.set_trace(runs[pick], f"race run ({pick})")
        st.success(f"The {pick} run is now the one the *EAGLE tree explorer* and *Rejection sampling lab* show.")


# ------------------------------------------------------------------------------------------------ the page

if "race_presenter" not in st.session_state:  # the URL's presenter flag, on the first visit
    st.session_state["race_presenter"] = st.query_params.get("presenter", "").lower() in TRUE
presenter = st.session_state["race_presenter"]
if presenter:
    st.html(PRESENTER_CSS)
    st.title("Topology race")
else:
    state.intro(
        "Topology race",
        "The same prompt, seed and sampling settings through every drafter available for this model, decoded one "
        "after another on the same target, then replayed side by side at the timings measured.  \nWatch how many "
        "tokens each target forward produced (τ), where the time goes (draft vs verify), and the measured speedup "
        "over plain autoregressive decoding (`none`).",
    )
top = st.container(horizontal=True, vertical_alignment="center")
top.toggle("Presenter mode", key="race_presenter", help="Large type, no sidebar: only the lanes and the speedup "
           "bars. The link keeps it (presenter=1).")
box = st.expander("Race settings", expanded=False) if presenter else st.container()

with box:
    bundle_box = box.container() if presenter else box.expander("Replay a saved race bundle (no model needed)")
    loaded = load_bundle(bundle_box)
if loaded is not None:
    name, runs, bundle_regimes, about = loaded
    start = next(iter(runs.values()))[0]
    said = {k: f"{v:.1f}" if isinstance(v, float) else v for k, v in about.items()}  # a load average to one decimal
    measured_on = "; ".join(f"{k.replace('_', ' ')}: " + (f"`{said[k]}`" if "`" not in str(said[k]) else plain(str(said[k])))
                            for k in ("machine", "date", "command", "load_average") if k in said)
    st.caption(f"Replaying the bundle {name}: model {figures.md_code(start['model'])}, {len(runs)} lanes"
               + (f", measured on {measured_on}" if measured_on else "") + ". "
               + ("Remove the file above" if st.session_state.get("race_upload") is not None else "Press *Back to "
                  "this server's race*") + " to return to this server's race.")
    if st.session_state.get("race_use_reference") and st.session_state.get("race_upload") is None:
        st.button("Back to this server's race", key="race_reference_off",
                  on_click=lambda: st.session_state.update(race_use_reference=False))
    with box:
        bundle_clock = clocks.clock_choice(st)
    show_race(runs, f"on {figures.md_code(start['device'])} ({figures.md_code(start['dtype'])}) when the bundle was recorded",
              presenter, bundle_regimes, bundle_clock, about)
    st.stop()

with box:
    shared, settings = state.require_model()
if shared is None:
    st.stop()

extra = other_engine()  # another engine's lane beside ours, when one is given
drafters = shared.drafters() + shared.variants() + ([extra.engine] if extra is not None else [])
sets = state.weight_sets(shared)  # the weight sets this model runs on here, the sidebar's first
prefill_from_url(drafters, sets)
follow_sidebar(settings)
for key, default in (("race_prompt", state.DEFAULT_PROMPT), ("race_drafters", drafters),
                     ("race_max_new", min(settings.max_new_tokens, 32)), ("race_weights", sets[:1])):
    st.session_state.setdefault(key, default)  # defaults here, not in the widgets: the URL may have set them
st.session_state["race_drafters"] = [d for d in st.session_state["race_drafters"] if d in drafters]  # another model
st.session_state["race_weights"] = [w for w in st.session_state["race_weights"] if w in sets] or sets[:1]
with box:
    clocks.pays_preset(sets, drafters, st)
    prompt = st.text_input("Prompt", key="race_prompt")
    c1, c2, c3, c4 = st.columns([1, 1, 1, 4])
    max_new = c1.number_input("Max new tokens", 1, 256, key="race_max_new",
                              help="Kept small by default: the drafters run one after another.")
    temperature = c2.number_input("Temperature", 0.0, 2.0, step=0.05, key="race_temperature",
                                  help="The race's own; it starts at the sidebar's and follows its changes.")
    seed = c3.number_input("Seed", 0, 2**31 - 1, key="race_seed", help="The race's own; it starts at the "
                           "sidebar's and follows its changes. The same seed gives the same runs.")
    picked = c4.multiselect("Drafters", drafters, key="race_drafters")
    c1, c2 = st.columns([3, 4])
    chosen_sets = (c1.multiselect("Weights", sets, key="race_weights", help="Each drafter is raced on each weight "
                                  "set chosen, in this one process (the second set is loaded beside the first "
                                  "once).") if len(sets) > 1 else sets[:1])
    clock = clocks.clock_choice(c2)
write_url(prompt, picked, temperature, int(seed), int(max_new), presenter,
          chosen_sets if len(sets) > 1 and chosen_sets != sets[:1] else None)
several = len(chosen_sets) > 1
lanes_of = {}  # lane -> (backend, drafter)
for weights in chosen_sets:
    on = state.on_weights(shared, weights) if weights else shared
    for d in picked:
        if d == getattr(extra, "engine", None):
            lanes_of.setdefault(d, (extra, None))  # None: the drafter that engine runs by default
        elif on is not None:
            lanes_of[regimes.lane_name(d, weights if several else None)] = (on, d)
chosen = list(lanes_of)
race_settings = replace(settings, temperature=float(temperature), seed=int(seed))
cache = st.session_state.setdefault("race_cache", {})  # (run_key(d), d) → events; revisits reuse runs
store = finished_runs()


def run_key(drafter: str) -> regimes.RunKey:
    """What a lane's run depends on besides its name: the prompt, the weight set its backend runs on (a lane's
    name carries no weights where the race runs one set) and the race's settings; the tree settings only for the
    tree drafters (changing them re-runs only those runs)."""
    return regimes.RunKey(prompt, getattr(lanes_of[drafter][0], "weights", None),
                          replace(race_settings, drafter="", max_new_tokens=int(max_new),
                                  tree=race_settings.tree_for(regimes.split_lane(drafter)[0])))


def store_key(drafter: str) -> tuple:
    return lanes_of[drafter][0].where(), run_key(drafter), drafter


for d in chosen:  # runs another session already finished with the same settings cost nothing
    if (run_key(d), d) not in cache and (found := store.get(store_key(d))) is not None:
        cache[(run_key(d), d)] = found
todo = [d for d in chosen if (run_key(d), d) not in cache]
with box:
    st.caption(f"top-p {settings.top_p}, top-k {settings.top_k}, K {settings.k} from the sidebar. "
               + (f"{len(chosen) - len(todo)} of {len(chosen)} runs are already decoded for these settings. "
                  if chosen else "")
               + "The address bar holds this race's settings: bookmark it to open the race prefilled.")
if not prompt.strip():
    box.warning("Enter a prompt to run the race.")
buttons = top if presenter else st.container(horizontal=True, vertical_alignment="center")
go_clicked = buttons.button(f"Run the race ({len(todo)} to decode)" if todo else "Run the race (replay)",
                            type="primary", key="race_run", disabled=not chosen or not prompt.strip())
again = buttons.button("Decode every lane again", key="race_redo", disabled=not chosen or bool(todo),
                       help="New measurements of the same runs (the texts stay the same for the same seed).")
if go_clicked or again:
    todo = chosen if again else todo
    bar = st.progress(0.0, text="starting…")
    events = []
    for i, drafter in enumerate(todo):
        def tick(event, evs, i=i, drafter=drafter):
            made = sum(len(s["committed"]) for s in state.steps_of(evs))
            bar.progress(min((i + made / max_new) / len(todo), 1.0),
                         text=f"decoding {drafter} ({i + 1} of {len(todo)}): {made} / {max_new} tokens; the lanes "
                              "replay once every run is decoded")
        lane_backend, lane_drafter = lanes_of[drafter]
        events = state.run_decode(lane_backend, prompt, race_settings, on_event=tick, drafter=lane_drafter,
                                  max_new_tokens=int(max_new))
        if events is None:
            break
        cache[(run_key(drafter), drafter)] = events
        store.put(store_key(drafter), events)
    bar.empty()
    st.session_state["race_started"] = True
    if events is not None:
        st.rerun()  # redraw with the new runs (and the button's label) from the cache

runs = {d: cache[(run_key(d), d)] for d in chosen if (run_key(d), d) in cache}
if not runs or not st.session_state.get("race_started"):
    st.info("Press **Run the race**: each drafter decodes in turn, then the lanes replay together.")
    st.stop()
show_race(runs, shared.where(), presenter, clocks.lane_regimes(lanes_of, list(runs)), clock)
