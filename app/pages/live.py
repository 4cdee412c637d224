import json
import re
import time

import streamlit as st

from app import figures, lanes, live_text, state, teaching
from specviz import analysis
from specviz.errors import SpecvizError

state.intro(
    "Live decoding",
    "Type a prompt and press **Run**: tokens appear as the target commits them, coloured by how they were made. "
    "Each step is one target forward pass (p = target, q = draft): it verifies the drafted tokens and always adds "
    "one token of its own: a replacement after a rejection, or a bonus when the accepted path reached a drafted "
    "token with no drafted child (on a chain: every drafted token accepted; on a tree: a leaf of the tree, "
    "wherever its siblings were). Hover a token for the test behind it: p, q, α, u and the rule.",
)
shared, settings = state.current()


def parse_trace(data: bytes, name: str) -> list[dict]:
    """An uploaded JSONL trace, checked like events.read_trace does, and every event against the schema."""
    events = lanes.parse_trace(data, name)
    if events[-1]["type"] != "done":
        st.warning(f"{name} ends before its done event (a stopped run); showing the steps it has.")
    return events


class View:
    """Placeholders for one run's display, redrawn as events arrive."""

    def __init__(self):
        st.html(live_text.legend_html())
        self.text = st.empty()
        self.metrics = st.empty()
        self.chart = st.empty()
        self.histogram = st.empty()
        self.log = st.empty()
        self.draws = 0

    def draw(self, events: list[dict]) -> None:
        start = events[0]
        steps = state.steps_of(events)
        self.text.html(live_text.tokens_html(steps, start["prompt_text"], start["sampling"]["temperature"] == 0))
        done = state.done_of(events)
        new_tokens = sum(len(s["committed"]) for s in steps)
        drafted = sum(analysis.drafted_in(s) or 0 for s in steps)
        accepted = sum(committed_accepted(s) for s in steps)
        rate = accepted / drafted if drafted else (done or {}).get("stats", {}).get("acceptance_rate")
        with self.metrics.container():
            cols = st.columns(5)
            cols[0].metric("steps (target forwards)", len(steps))
            cols[1].metric("tokens", new_tokens)
            cols[2].metric("τ (tokens per step)", f"{new_tokens / len(steps):.2f}" if steps else "—")
            cols[3].metric("acceptance rate", f"{rate:.0%}" if rate is not None else "—")
            tps = done["stats"]["tokens_per_s"] if done else (steps[-1]["timing"]["tokens_per_s"] if steps else 0)
            cols[4].metric("tokens/s", f"{tps:.1f}")
            st.caption(f"drafter `{start['drafter']}` · model `{start['model']}` · "
                       f"temperature {start['sampling']['temperature']} · seed {start['seed']} · "
                       + (f"stopped: {done['stop_reason']}" if done else "running or stopped early"))
            if start.get("detail") == "counts":
                st.info(teaching.counts_note(start.get("engine", "this engine")))
            if start.get("lossy"):
                st.warning(teaching.LOSSY_NOTE)
        if steps:
            self.draws += 1
            self.chart.plotly_chart(figures.steps_chart(steps), key=f"live_chart_{self.draws}")
            counts = figures.step_histogram(steps, done)
            with self.histogram.container():
                if counts:
                    nothing = analysis.drafted_nothing(steps)
                    st.plotly_chart(figures.acceptance_histogram_figure(
                        {start["drafter"]: counts}, f"acceptance histogram: {sum(counts)} steps drafted, {nothing} "
                        "drafted nothing; steps accepting 0, 1, 2, … drafted tokens: " + ", ".join(map(str, counts)),
                        no_draft={start["drafter"]: nothing}), key=f"live_histogram_{self.draws}")
                    st.caption(teaching.HISTOGRAM_NOTE)
            self.log.dataframe(step_log(steps), hide_index=True, height=min(400, 36 * (len(steps) + 1) + 3))


def committed_accepted(step: dict) -> int:
    """Drafted tokens accepted and committed: a token accepted past an end-of-sequence cut is not."""
    return sum(c["kind"] == "accepted" for c in step["committed"])


def step_log(steps: list[dict]) -> list[dict]:
    return [
        {
            "step": s["step"],
            "drafted": analysis.drafted_in(s),
            "tested": len(s.get("tests", [])),
            "accepted": committed_accepted(s),
            "ends with": analysis.ends_with(s),
            "tokens committed": " ".join(figures.visible(c["text"]) for c in s["committed"]),
            "draft ms": round(s["timing"]["draft_ms"], 1),
            "verify ms": round(s["timing"]["verify_ms"], 1),
        }
        for s in steps
    ]


WATCH_ID = re.compile(r"watch-[A-Za-z0-9_-]{16,64}")  # a share id of specviz serve: 128 random bits
DRAW_EVERY_S = 0.25  # a viewer redraws at most this often (the last event always): a room of viewers shares a CPU


def throttled(view: View):
    """on_event for a watched run: redraw at most every DRAW_EVERY_S, and at the end."""
    last = [0.0]

    def on_event(event: dict, events: list[dict]) -> None:
        if event["type"] == "done" or time.monotonic() - last[0] >= DRAW_EVERY_S:
            last[0] = time.monotonic()
            view.draw(events)

    return on_event


def watch_link(share_id: str) -> str:
    """This page's address with ?watch=: what the presenter gives the room."""
    here = (st.context.url or "").split("?")[0]
    return f"{here or '/live'}?watch={share_id}"


def watch(share_id: str) -> None:
    """The page for a watch link: another session's shared run, read-only, from its first step."""
    if not WATCH_ID.fullmatch(share_id):
        st.error(f"This is not a watch link (it names {figures.md_code(share_id[:80])}); ask the presenter for it.")
        return
    st.info("**Watching a shared run** (read-only): the presenter's run on the engine service, from its first step "
            "however late you came. Open this page without `?watch=` to decode yourself.")
    view = View()
    saved = st.session_state.get("watch_events")
    if st.session_state.get("watch_id") == share_id and saved and state.done_of(saved):
        view.draw(saved)
        return
    events: list[dict] = []
    st.session_state["watch_id"], st.session_state["watch_events"] = share_id, events
    if state.watch_decode(shared, share_id, into=events, on_event=throttled(view)):  # its last event drawn
        state.set_trace(events, "watched run")


if watching := st.query_params.get("watch", "").strip():
    watch(watching)
    st.stop()

prompt = st.text_area("Prompt", state.DEFAULT_PROMPT, key="live_prompt", height=90)
buttons = st.container(horizontal=True, vertical_alignment="center")
run = buttons.button("Run", type="primary", key="live_run", disabled=shared is None)
stop = buttons.button("Stop", key="live_stop", help="Stops the run after the current step; what was decoded so far stays.")
share = state.can_share(shared) and buttons.checkbox(
    "Share with viewers", key="live_share", help="The run gets a read-only watch link: every browser that opens it "
    "follows this run as it decodes (one decode on the service, however many watch), from its first step.")
if share and st.session_state.get("live_watch_link") and not run:
    st.caption(f"Watch link of your last shared run: {st.session_state['live_watch_link']}")
if shared is None:
    st.warning("No model is loaded: choose one in the sidebar, or replay a saved trace below.")
elif settings is not None:
    buttons.caption(f"drafter **{settings.drafter}**, temperature {settings.temperature}, K {settings.k}, "
               f"max {settings.max_new_tokens} new tokens, seed {settings.seed} (change them in the sidebar)")

with st.expander("Replay a saved trace (no model needed)"):
    upload = st.file_uploader("A specviz trace (.jsonl)", type=["jsonl", "json", "txt"], key="live_upload")
    if upload is not None and st.session_state.get("live_upload_id") != upload.file_id:
        st.session_state["live_upload_id"] = upload.file_id
        try:
            uploaded = parse_trace(upload.getvalue(), upload.name)
        except SpecvizError as err:
            st.error(str(err))
        else:
            st.session_state["live_events"] = uploaded
            source = f"uploaded trace {figures.md_code(upload.name)}"  # shown in Markdown: no links or markup
            st.session_state["live_source"] = source
            state.set_trace(uploaded, source)
    animate = st.button("Replay step by step", key="live_animate",
                        disabled=not st.session_state.get("live_events"))

if stop and st.session_state.get("live_events"):
    n = len(state.steps_of(st.session_state["live_events"]))
    if not state.done_of(st.session_state["live_events"]):
        st.info(f"Stopped after {n} steps.")

view = View()
if run and shared is not None:
    events: list[dict] = []
    st.session_state["live_events"] = events  # a stop keeps what was decoded so far
    st.session_state["live_source"] = "live run"
    link = st.empty()

    def shared_as(share_id: str) -> None:
        st.session_state["live_watch_link"] = watch_link(share_id)
        link.info(f"Viewers open **{st.session_state['live_watch_link']}** to watch this run (read-only).")

    result = state.run_decode(shared, prompt, settings, into=events, on_event=lambda e, evs: view.draw(evs),
                              on_shared=shared_as if share else None)
    if result is None:
        st.session_state.pop("live_events", None)
    else:
        view.draw(events)
        state.set_trace(events, "live run")
elif animate and st.session_state.get("live_events"):
    saved = st.session_state["live_events"]
    shown = [saved[0]]
    for event in saved[1:]:
        shown.append(event)
        view.draw(shown)
        time.sleep(0.15)
    view.draw(saved)
elif st.session_state.get("live_events"):
    view.draw(st.session_state["live_events"])
    st.caption(f"Showing the last {st.session_state.get('live_source', 'run')}.")

saved = st.session_state.get("live_events")
if saved:
    st.download_button(
        "Download this trace (JSONL)",
        "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in saved),
        file_name=f"specviz-{saved[0]['drafter']}-seed{saved[0]['seed']}.jsonl",
        mime="application/jsonl",
        key="live_download",
    )
    if state.done_of(saved):
        st.caption("The *EAGLE tree explorer* and *Rejection sampling lab* pages look inside the steps of this run.")
