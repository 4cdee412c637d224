"""The race document's stylesheet (app/lanes.py embeds it): the lanes, their controls, the speed bars, and
presenter mode's larger type and lanes two abreast."""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; padding: 8px; color: #222;
       font-size: 15px; background: #fff; }
body.presenter { font-size: 22px; }
/* presenter mode on a projector: the lanes two abreast, each text five lines high and kept scrolled to its newest
   tokens (a column-reverse box starts at its end), so four lanes (six: three rows) fit one 1920x1080 screen */
@media (min-width: 900px) {
  body.presenter #race { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); column-gap: 12px; }
  body.presenter #race > :not(.lane) { grid-column: 1 / -1; }
  body.presenter .lane { margin: 3px 0; padding: 4px 10px; }
  body.presenter .lane-head { row-gap: 0; }
  body.presenter .lane-label { font-size: 0.6em; }
  body.presenter .track { margin: 3px 0; }
  body.presenter .text { line-height: 1.3; }
  body.presenter .text-box { max-height: 6.5em; overflow-y: auto; display: flex; flex-direction: column-reverse; }
}
.controls { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
.controls button, .controls select { font-size: 1em; padding: 4px 10px; border: 1px solid #bbb; border-radius: 6px;
       background: #f7f7f7; cursor: pointer; }
.controls button.primary { background: #ff4b4b; color: #fff; border-color: #ff4b4b; }
.clock { font-variant-numeric: tabular-nums; font-weight: 600; margin-left: 8px; }
.note { color: #555; font-size: 0.85em; margin: 4px 0 10px; }
body.presenter .note { font-size: 0.6em; }
.legend span { padding: 2px 6px; border-radius: 4px; margin-right: 8px; font-size: 0.8em; }
.lane { border: 1px solid #ddd; border-radius: 8px; padding: 8px 10px; margin: 8px 0; }
.lane.finished { border-color: #2ca02c; }
.lane-head { display: flex; gap: 14px; align-items: baseline; flex-wrap: wrap; font-variant-numeric: tabular-nums; }
.lane-name { font-weight: 700; font-family: monospace; font-size: 1.1em; min-width: 7em; }
.stat b { font-weight: 600; }
.lane-label { font-size: 0.85em; color: #555; font-family: monospace; }
.note.modelled { color: #9a3412; font-weight: 600; }
.finish { margin-left: auto; font-weight: 700; color: #2ca02c; visibility: hidden; }
.lane.finished .finish { visibility: visible; }
.same { font-size: 0.85em; visibility: hidden; }
.lane.finished .same { visibility: visible; }
.same.ok { color: #2ca02c; } .same.bad { color: #d62728; font-weight: 700; }
.track { height: 6px; background: #eee; border-radius: 3px; margin: 6px 0; overflow: hidden; }
.fill { height: 100%; width: 0; background: #1f77b4; }
.lane.finished .fill { background: #2ca02c; }
.text { white-space: pre-wrap; font-family: monospace; line-height: 1.7; }
.tok { border-radius: 3px; visibility: hidden; }
.tok.shown { visibility: visible; }
.bars { margin-top: 14px; }
.bars h4 { margin: 0 0 6px; }
.bar-row { display: flex; align-items: center; gap: 8px; margin: 4px 0; visibility: hidden; }
.bar-row.shown { visibility: visible; }
.bar-name { font-family: monospace; min-width: 7em; }
.bar { height: 1.2em; background: #1f77b4; border-radius: 3px; }
.bar-value { font-variant-numeric: tabular-nums; font-weight: 600; }
"""
