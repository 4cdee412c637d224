"""The topology race's lanes: one per drafter, built from its run's events; replayed together on one clock in a
self-contained HTML document (inline CSS and JS, no network); saved as, and loaded back from, a trace bundle (a
zip of one JSONL trace per lane and a manifest). No streamlit here.

The runs of a race decode one after another on one device, so the document replays them at their measured
timings: each step's tokens appear at that step's `timing.elapsed_s`, the time since its own run started.
"""
from __future__ import annotations

import io
import json
import re
import tempfile
import threading
import zipfile
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app import regimes
from app.figures import KIND_COLOURS, KIND_LABELS
from app.race_style import CSS as _CSS
from specviz import roofline
from specviz.decoding import events as ev
from specviz.drafters import PLAIN
from specviz.errors import SpecvizError

BUNDLE_FORMAT = "specviz-race-bundle"
BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 256 * 2**20  # uncompressed; a race of a few drafters at 256 tokens is a few MB
SPEEDS = (0.25, 0.5, 1, 2, 4)
MODELLED_SPEEDS = (0.01, 0.02, 0.05, 0.1, 0.25, 1)  # a modelled GPU's race lasts a fraction of a second: slowed
# a spec such as eagle2:lookup=4, on a named weight set where the race runs several (eagle2@fp32)
DRAFTER_NAME = re.compile(r"[a-z][a-z0-9_]*(:[a-z_]+=[A-Za-z0-9_.]+)*(@[a-z0-9]+)?")
# lane -> {"weights": str | None, "verify_cost_ratio": float | None, "draft_share": float}: what a lane ran on
Regimes = dict
REGIME_KEYS = ("weights", "verify_cost_ratio", "draft_share")
# what a lane from another engine, or of counts only, says under a modelled clock
MEASURED_ONLY = "measured time: a modelled clock replays only specviz's own steps"


@dataclass(frozen=True)
class Lane:
    """One drafter's run as the race replays it."""

    drafter: str
    steps: list[dict]  # [{"step", "t": timing.elapsed_s, "tokens_per_s", "tokens": [[text, kind], ...]}]
    finish_s: float  # the last step's elapsed_s: when the run's last token was committed
    new_tokens: int
    tokens_per_s: float  # the done event's: new tokens / wall time
    tau: float
    stop_reason: str
    same_as_none: bool | None  # at temperature 0 beside a `none` lane: is the text none's? else None
    weights: str | None = None  # the weight set it ran on, where the race names it
    label: str = ""  # its weights and measured c(8) ÷ c(1) (app.regimes.lane_label)
    baseline: str | None = None  # the lane its speedup is over: `none` on the same weights


def temperature_of(runs: dict[str, list[dict]]) -> float:
    """The race's temperature (every lane's start event carries the same one)."""
    return max(events[0]["sampling"]["temperature"] for events in runs.values())


def modelled(events: list[dict[str, Any]]) -> bool:
    """Whether a modelled clock can replay a run: specviz's own steps in full detail (each step's tree or chain,
    whose draft forwards and verified tokens it prices). Another engine's steps are chunks of committed tokens
    with at most the drafted and accepted counts."""
    start = events[0]
    return bool(start.get("engine", "specviz") == "specviz" and start.get("detail", ev.FULL) == ev.FULL)


def build_lanes(runs: dict[str, list[dict]], regimes_of: Regimes | None = None, clock=None) -> list[Lane]:
    """Lanes, in the order of `runs` ({lane: its events}); each run must be finished (end with done). regimes_of:
    each lane's weights, measured c(8) ÷ c(1) and draft share, where known. clock: a specviz.roofline.Roofline that
    times the steps instead of the measured elapsed_s (a modelled clock), or None; a lane it cannot replay
    (`modelled`) keeps its measured time, says so, and has no speedup over a modelled `none`."""
    greedy = temperature_of(runs) == 0
    lanes = []
    for name, events in runs.items():
        done = events[-1]
        steps = [e for e in events if e["type"] == "step"]
        base = regimes.baseline_of(name, list(runs), PLAIN)
        regime = (regimes_of or {}).get(name, {})
        weights = regime.get("weights", regimes.split_lane(name)[1])
        timed = clock if modelled(events) else None
        if timed is not None and "draft_share" in regime:
            timed = roofline.with_draft_share(timed, regime["draft_share"])
        kept = clock is not None and timed is None  # measured time beside modelled lanes
        times = [s["timing"]["elapsed_s"] for s in steps] if timed is None else roofline.step_times(events, timed)
        made = [sum(len(s["committed"]) for s in steps[:i + 1]) for i in range(len(steps))]
        rates = ([s["timing"]["tokens_per_s"] for s in steps] if timed is None
                 else [n / t if t else 0.0 for n, t in zip(made, times)])
        lanes.append(Lane(
            drafter=name,
            steps=[{"step": s["step"], "t": t, "tokens_per_s": rate,
                    "tokens": [[c["text"], c["kind"]] for c in s["committed"]]} for s, t, rate in zip(steps, times, rates)],
            finish_s=times[-1] if steps else 0.0,
            new_tokens=done["stats"]["new_tokens"],
            tokens_per_s=done["stats"]["tokens_per_s"] if timed is None else roofline.modelled_tokens_per_s(events, timed),
            tau=done["stats"]["tau"],
            stop_reason=done["stop_reason"],
            same_as_none=done["token_ids"] == runs[base][-1]["token_ids"] if greedy and base else None,
            weights=weights,
            label=" · ".join(filter(None, (regimes.lane_label(weights, regime.get("verify_cost_ratio"))
                                           if regime or weights else "", clock_label(timed, kept)))),
            baseline=None if kept else base,
        ))
    return lanes


def clock_label(clock: roofline.Roofline | None, kept: bool) -> str:
    """What a lane says of its clock: the modelled one's c(8) ÷ c(1), or that it kept its measured time."""
    if kept:
        return MEASURED_ONLY
    return "" if clock is None else f"MODELLED clock: c(8)/c(1) {clock.forward_s(8) / clock.forward_s(1):.2f}"


def first_difference(base: list[dict], other: list[dict]) -> dict | None:
    """Where a greedy run's tokens first part from `none`'s (None where they do not): the index, each run's token
    there, and the target's top tokens at that position as `none`'s step saw them ([id, text, p]; at temperature 0
    p is the softmax of the logits, so ln(p1 ÷ p2) is the gap between the top two logits)."""
    a, b = base[-1]["token_ids"], other[-1]["token_ids"]
    if a == b:
        return None
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    done, top = 0, []
    for step in (e for e in base if e["type"] == "step"):
        done += len(step["committed"])
        if done > index:  # `none` commits one token a step, drawn from its final distribution
            top = step["final"]["dist_top"] or []
            break
    return {"index": index, "none": a[index] if index < len(a) else None, "got": b[index] if index < len(b) else None,
            "top": top}


# ------------------------------------------------------------------------------------------ the document


def _script_json(data) -> str:
    """JSON that is safe inside <script>: no <, > or & survives, so no token text can close the element."""
    return (json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


def race_data(lanes: list[Lane], *, prompt: str, temperature: float, max_new_tokens: int, note: str,
              presenter: bool = False, clock=None, one_run: bool = True) -> dict:
    """Everything the document shows, as the JSON it embeds. clock: the specviz.roofline.Roofline the lanes were
    timed on (the document then says MODELLED, with the formula and its caveat), or None (measured time).
    one_run: each bar is one run of each lane (the document says so)."""
    return {
        "prompt": prompt, "temperature": temperature, "max_new_tokens": max_new_tokens, "note": note,
        "presenter": presenter, "speeds": list(SPEEDS if clock is None else MODELLED_SPEEDS),
        "speed": 1 if clock is None else MODELLED_SPEEDS[1],
        "clock": "measured" if clock is None else "MODELLED",
        "clock_note": "" if clock is None else f"{clock.describe()}. {roofline.FORMULA}. {roofline.CAVEAT}",
        "one_run": one_run,
        "kinds": {k: {"colour": KIND_COLOURS[k], "label": KIND_LABELS[k]} for k in KIND_COLOURS},
        "lanes": [asdict(lane) for lane in lanes],
    }


def read_race_data(document: str) -> dict:
    """The JSON a race document embeds (the inverse of race_document's embedding)."""
    found = re.search(r'<script type="application/json" id="race-data">(.*?)</script>', document, re.S)
    if found is None:
        raise SpecvizError("not a specviz race document")
    return json.loads(found.group(1))


def race_document(data: dict) -> str:
    """One HTML file that replays the lanes of `data` (race_data's) on one clock; it starts playing on load."""
    # the data last: no marker inside a prompt or a token can be filled in after it
    return (_DOCUMENT.replace("/*CSS*/", _CSS).replace("/*JS*/", _JS)
            .replace("/*PRESENTER*/", " presenter" if data["presenter"] else "").replace("/*DATA*/", _script_json(data)))


_DOCUMENT = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specviz topology race</title>
<style>/*CSS*/</style></head>
<body class="race/*PRESENTER*/">
<script type="application/json" id="race-data">/*DATA*/</script>
<div id="race"></div>
<script>/*JS*/</script>
</body></html>
"""

_JS = r"""
(function () {
  const D = JSON.parse(document.getElementById("race-data").textContent);
  const root = document.getElementById("race");
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const fmt = (x, d) => x.toFixed(d);
  const ordinal = n => n + ({ 1: "st", 2: "nd", 3: "rd" }[n % 100 > 10 && n % 100 < 14 ? 0 : n % 10] || "th");
  const byName = Object.fromEntries(D.lanes.map(l => [l.drafter, l]));
  const based = D.lanes.some(l => l.baseline);
  const end = Math.max(0, ...D.lanes.map(l => l.finish_s));
  // the global clock's steps: every moment at which some lane commits tokens
  const times = [...new Set(D.lanes.flatMap(l => l.steps.map(s => s.t)))].sort((a, b) => a - b);
  let clock = 0, speed = D.speed, playing = false, last = null;

  const controls = el("div", "controls");
  const play = el("button", "primary", "Start");
  const restart = el("button", "", "Restart");
  const back = el("button", "", "◀ step");
  const next = el("button", "", "step ▶");
  const speedSel = el("select");
  D.speeds.forEach(s => { const o = el("option", "", s + "×"); o.value = s; if (s === D.speed) o.selected = true; speedSel.appendChild(o); });
  const clockEl = el("span", "clock");
  play.id = "race-play"; next.id = "race-next"; back.id = "race-back"; restart.id = "race-restart"; speedSel.id = "race-speed";
  controls.append(play, restart, back, next, el("span", "", "speed"), speedSel, clockEl);
  root.appendChild(controls);
  root.appendChild(el("div", "note", D.note));
  if (D.clock_note) root.appendChild(el("div", "note modelled", D.clock_note));
  const legend = el("div", "legend");
  for (const k in D.kinds) { const s = el("span", "", D.kinds[k].label); s.style.background = D.kinds[k].colour; legend.appendChild(s); }
  root.appendChild(legend);

  const views = D.lanes.map(lane => {
    const box = el("div", "lane");
    box.dataset.drafter = lane.drafter;
    box.dataset.tokens = "0"; box.dataset.steps = "0"; box.dataset.finished = "0";
    const head = el("div", "lane-head");
    const stats = { tokens: el("span", "stat"), steps: el("span", "stat"), tau: el("span", "stat"), tps: el("span", "stat") };
    const finish = el("span", "finish");
    head.append(el("span", "lane-name", lane.drafter));
    if (lane.label) head.appendChild(el("span", "lane-label", lane.label));
    head.append(stats.tokens, stats.steps, stats.tau, stats.tps);
    if (lane.same_as_none !== null && lane.drafter !== lane.baseline) {
      head.appendChild(el("span", "same " + (lane.same_as_none ? "ok" : "bad"),
        lane.same_as_none ? "same text as none ✓" : "differs from none ⚠"));
    }
    head.appendChild(finish);
    const track = el("div", "track"), fill = el("div", "fill");
    track.appendChild(fill);
    const text = el("div", "text");
    const spans = lane.steps.map(s => s.tokens.map(([t, kind]) => {
      const span = el("span", "tok", t);
      span.style.background = D.kinds[kind].colour;
      span.title = "step " + s.step + ": " + D.kinds[kind].label;
      text.appendChild(span);
      return span;
    }));
    const scroller = el("div", "text-box");  // in presenter mode a few lines high, scrolled to the newest
    scroller.appendChild(text);
    box.append(head, track, scroller);
    root.appendChild(box);
    return { lane, box, stats, fill, finish, spans, shown: 0 };
  });

  const bars = el("div", "bars");
  const clockWord = D.clock === "MODELLED" ? "MODELLED" : "measured";
  const runs = D.one_run ? "; one run of each lane, not a median: a rerun moves them" : "";
  bars.appendChild(el("h4", "", based ? "Speedup over none on the same weights (tokens/s ÷ that none's tokens/s, " + clockWord + runs + ")"
                                      : "tokens/s (" + clockWord + runs + ")"));
  const value = l => l.baseline ? l.tokens_per_s / byName[l.baseline].tokens_per_s : l.tokens_per_s;
  const top = Math.max(1e-9, ...D.lanes.map(value));
  const barRows = D.lanes.map(lane => {
    const row = el("div", "bar-row"), bar = el("div", "bar");
    row.dataset.drafter = lane.drafter;
    bar.style.width = (60 * value(lane) / top) + "%";
    row.append(el("span", "bar-name", lane.drafter), bar,
      el("span", "bar-value", lane.baseline ? fmt(value(lane), 2) + "×" : fmt(value(lane), 1) + " tokens/s"));
    bars.appendChild(row);
    return row;
  });
  root.appendChild(bars);

  function render() {
    const finished = views.filter(v => v.lane.finish_s <= clock).sort((a, b) => a.lane.finish_s - b.lane.finish_s);
    views.forEach((v, i) => {
      const n = v.lane.steps.filter(s => s.t <= clock).length;
      if (n !== v.shown) {
        v.spans.forEach((step, j) => step.forEach(span => span.classList.toggle("shown", j < n)));
        v.shown = n;
      }
      const tokens = v.spans.slice(0, n).reduce((a, s) => a + s.length, 0);
      const done = v.lane.finish_s <= clock;
      v.box.dataset.tokens = String(tokens); v.box.dataset.steps = String(n);
      v.box.dataset.finished = done ? "1" : "0";
      const rank = finished.indexOf(v) + 1;
      v.box.dataset.rank = done ? String(rank) : "";
      v.finish.textContent = done ? "✓ finished " + ordinal(rank) + " · " + fmt(v.lane.finish_s, 2) + " s" : "";
      v.box.classList.toggle("finished", done);
      v.stats.tokens.innerHTML = ""; v.stats.tokens.append(el("b", "", String(tokens)), " tokens");
      v.stats.steps.innerHTML = ""; v.stats.steps.append(el("b", "", String(n)), " steps");
      v.stats.tau.innerHTML = ""; v.stats.tau.append("τ ", el("b", "", n ? fmt(tokens / n, 2) : "–"));
      v.stats.tps.innerHTML = "";
      v.stats.tps.append(el("b", "", n ? fmt(done ? v.lane.tokens_per_s : v.lane.steps[n - 1].tokens_per_s, 1) : "–"), " tokens/s");
      v.fill.style.width = (100 * tokens / Math.max(1, D.max_new_tokens)) + "%";
      barRows[i].classList.toggle("shown", done);
    });
    clockEl.textContent = "t = " + fmt(clock, 3) + " s of " + fmt(end, 3) + " s (" + clockWord + " time)";
    play.textContent = playing ? "Pause" : (clock >= end ? "Replay" : (clock > 0 ? "Resume" : "Start"));
    document.body.dataset.clock = String(clock);
  }

  function frame(now) {
    if (!playing) return;
    if (last !== null) clock = Math.min(end, clock + (now - last) / 1000 * speed);
    last = now;
    if (clock >= end) playing = false;
    render();
    if (playing) requestAnimationFrame(frame);
  }
  function start() {
    if (clock >= end) clock = 0;
    playing = true; last = null;
    requestAnimationFrame(frame);
  }
  function pause() { playing = false; render(); }
  function stepTo(t) { playing = false; clock = Math.max(0, Math.min(end, t)); render(); }
  const eps = 1e-9;
  play.onclick = () => (playing ? pause() : start());
  restart.onclick = () => { clock = 0; render(); start(); };  // shown at 0 at once, not a frame later
  next.onclick = () => stepTo(times.find(t => t > clock + eps) ?? end);
  back.onclick = () => stepTo([...times].reverse().find(t => t < clock - eps) ?? 0);
  speedSel.onchange = () => { speed = parseFloat(speedSel.value); };
  document.addEventListener("keydown", e => {
    if (e.key === " ") { e.preventDefault(); play.onclick(); }
    else if (e.key === "ArrowRight") next.onclick();
    else if (e.key === "ArrowLeft") back.onclick();
  });
  render();
  setTimeout(start, 400);
})();
"""


# ------------------------------------------------------------------------------------------ the bundle


def lane_file(index: int, drafter: str) -> str:
    """The bundle member of lane `index` (1-based): drafter specs such as eagle2:lookup=4 made file-safe."""
    return f"lane-{index}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', drafter)}.jsonl"


def write_bundle(runs: dict[str, list[dict]], regimes_of: Regimes | None = None, about: dict | None = None) -> bytes:
    """The race as a zip: one trace per lane (events.write_trace's JSONL) and manifest.json naming them, with each
    lane's weights, measured c(8) ÷ c(1) and draft share where known (regimes_of) and where the race was measured
    (about: machine, date, command)."""
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "schema_version": ev.SCHEMA_VERSION,
                "prompt": next(iter(runs.values()))[0]["prompt_text"] if runs else "",
                **({"about": about} if about else {}),
                "lanes": [{"drafter": d, "trace": lane_file(i, d), "new_tokens": events[-1]["stats"]["new_tokens"],
                           **{k: v for k, v in (regimes_of or {}).get(d, {}).items() if k in REGIME_KEYS}}
                          for i, (d, events) in enumerate(runs.items(), 1)]}
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("manifest.json", json.dumps(manifest, ensure_ascii=False, indent=1))
        for lane, events in zip(manifest["lanes"], runs.values()):
            path = Path(tmp) / lane["trace"]
            ev.write_trace(events, path)
            zf.write(path, lane["trace"])
    return buffer.getvalue()


def read_bundle(data: bytes, name: str = "bundle") -> dict[str, list[dict]]:
    """{drafter: events} from a bundle write_bundle made; any other file is a SpecvizError that says why."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise SpecvizError(f"{name}: not a zip file (a race bundle is the zip the race page downloads)") from None
    with zf:
        if sum(info.file_size for info in zf.infolist()) > MAX_BUNDLE_BYTES:
            raise SpecvizError(f"{name}: over {MAX_BUNDLE_BYTES // 2**20} MB uncompressed; not a race bundle")
        manifest = _manifest(zf, name)
        runs = {}
        for lane in manifest["lanes"]:
            drafter, member = lane["drafter"], lane["trace"]
            if not DRAFTER_NAME.fullmatch(drafter):
                raise SpecvizError(f"{name}: the manifest's {drafter[:40]!r} is not a drafter name")
            if drafter in runs:
                raise SpecvizError(f"{name}: the manifest lists drafter {drafter!r} twice")
            try:
                text = zf.read(member)
            except KeyError:
                raise SpecvizError(f"{name}: the manifest names {member}, which the zip does not hold") from None
            runs[drafter] = parse_trace(text, f"{name}: {member}", finished=True)
            if runs[drafter][0]["drafter"] != re.split("[:@]", drafter, maxsplit=1)[0]:  # eagle2:lookup=4 runs eagle2
                raise SpecvizError(f"{name}: {member} is a run of {runs[drafter][0]['drafter']!r}, "
                                   f"not of {drafter!r} as the manifest says")
    _check_one_race(runs, name)
    return runs


def bundle_about(data: bytes) -> tuple[Regimes, dict]:
    """A bundle's lanes' weights, c(8) ÷ c(1) and draft shares (as build_lanes takes them) and where it was
    measured (its manifest's `about`: machine, date, command; empty where it says nothing). Read after read_bundle
    checked it."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    regimes_of = {lane["drafter"]: {key: lane[key] for key in REGIME_KEYS if key in lane}
                  for lane in manifest["lanes"]}
    about = manifest.get("about")
    return {k: v for k, v in regimes_of.items() if v}, about if isinstance(about, dict) else {}


RACE_FIELDS = ("model", "prompt_text", "sampling", "seed", "max_new_tokens")  # what every lane of one race shares


def _check_one_race(runs: dict[str, list[dict]], name: str) -> None:
    """Every lane of a bundle ran the same prompt, model, sampling, seed and token budget (else the lanes are no
    race, and "same text as none" would compare runs of different settings)."""
    first, *others = runs.items()
    for drafter, events in others:
        for field in RACE_FIELDS:
            if events[0][field] != first[1][0][field]:
                raise SpecvizError(f"{name}: the {drafter} lane ran with another {field.replace('_', ' ')} than "
                                   f"the {first[0]} lane: a race's lanes share one prompt, model and settings")


def _manifest(zf: zipfile.ZipFile, name: str) -> dict:
    try:
        manifest = json.loads(zf.read("manifest.json"))
    except KeyError:
        raise SpecvizError(f"{name}: no manifest.json (not a race bundle)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecvizError(f"{name}: manifest.json is not JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise SpecvizError(f"{name}: manifest.json is not a {BUNDLE_FORMAT} manifest")
    if manifest.get("version") != BUNDLE_VERSION:
        raise SpecvizError(f"{name}: bundle version {manifest.get('version')}, this specviz reads {BUNDLE_VERSION}")
    lanes = manifest.get("lanes")
    if not isinstance(lanes, list) or not lanes or not all(
            isinstance(lane, dict) and isinstance(lane.get("drafter"), str) and isinstance(lane.get("trace"), str)
            for lane in lanes):
        raise SpecvizError(f"{name}: manifest.json lists no lanes (each needs a drafter and a trace file)")
    return manifest


def parse_trace(data: bytes, name: str, finished: bool = False) -> list[dict]:
    """A JSONL trace's events, checked as events.read_trace does and each against the event schema; with
    `finished`, it must end with its done event."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_bytes(data)
        try:
            events = ev.read_trace(path)
        except UnicodeDecodeError:
            raise SpecvizError(f"{name}: not a text file") from None
        except SpecvizError as err:
            raise SpecvizError(str(err).replace(str(path), name)) from None
    for n, event in enumerate(events, 1):
        try:
            ev.validate(event)
        except Exception as err:  # jsonschema.ValidationError: say where, briefly
            raise SpecvizError(f"{name}: event {n} does not follow the specviz event schema: "
                               f"{getattr(err, 'message', err)}") from None
    if finished and events[-1]["type"] != "done":
        raise SpecvizError(f"{name}: the run ends before its done event (a stopped run cannot race)")
    return events


# ------------------------------------------------------------------------------------------ finished races


class RunStore:
    """Finished runs shared by every browser session of the process: {key: events}, the oldest dropped past
    `max_runs`. A key holds everything a run depends on, its seed included, so a run found here is the run a
    new decode would produce (its timings are those measured when it ran). Safe to use from several threads."""

    def __init__(self, max_runs: int = 256):
        self.max_runs = max_runs
        self.runs: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key) -> list[dict] | None:
        with self.lock:
            events = self.runs.get(key)
            if events is not None:
                self.runs.move_to_end(key)
            return events

    def put(self, key, events: list[dict]) -> None:
        with self.lock:
            self.runs[key] = events
            self.runs.move_to_end(key)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
