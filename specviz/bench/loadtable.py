"""The load table as JSON: N clients at once streaming runs from vLLM (plain, and with our EAGLE-3 head) and from
`specviz serve` (our engine), written by `scripts/load_table.py --json-out FILE`, read by the Cost page.

    {"date", "command", "cpu", "cores", "setup", "versions", "clients": [1, 4, 16], "rounds", "max_new_tokens",
     "lanes": [{"label", "engine", "method", "by_clients": {"N": summary}, "phases": {"N": [one result a round]}}],
     "pairs": ["<vLLM lane> / <specviz lane>"], "ratios": {pair: {"N": [vLLM's aggregate over ours, per round]}}}

A summary is a lane's phases with N clients over the rounds: aggregate tokens/s (a phase's tokens ÷ its wall
time; the median over rounds, and [min, max]), the time from a request to its first committed token (median and
p90 over every run), how many runs finished and how many failed (with the first error).
"""
from __future__ import annotations

import os
from pathlib import Path

from specviz.bench.schema import parse_json
from specviz.errors import SpecvizError

SHIPPED = Path(__file__).resolve().parent / "data" / "load-table-cpu.json"  # the table shipped with specviz
COMMAND = "python scripts/load_table.py --json-out specviz/bench/data/load-table-cpu.json"  # makes SHIPPED

_SECONDS = {"type": ["number", "null"], "minimum": 0}  # null: no run of the phase finished
SUMMARY_SCHEMA = {
    "type": "object",
    "required": ["aggregate_tokens_per_s", "aggregate_range", "ttft_median_s", "ttft_p90_s", "runs", "errors"],
    "properties": {"aggregate_tokens_per_s": {"type": "number", "minimum": 0},
                   "aggregate_range": {"type": "array", "items": {"type": "number", "minimum": 0},
                                       "minItems": 2, "maxItems": 2},
                   "ttft_median_s": _SECONDS, "ttft_p90_s": _SECONDS,
                   "runs": {"type": "integer", "minimum": 0}, "errors": {"type": "integer", "minimum": 0},
                   "first_error": {"type": ["string", "null"]}},
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specviz load table",
    "type": "object",
    "required": ["date", "command", "cpu", "cores", "setup", "clients", "rounds", "max_new_tokens", "lanes"],
    "properties": {
        "date": {"type": "string"}, "command": {"type": "string"}, "cpu": {"type": "string"},
        "cores": {"type": ["integer", "null"]}, "setup": {"type": "string"},
        "versions": {"type": "object", "additionalProperties": {"type": "string"}},
        "clients": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
        "rounds": {"type": "integer", "minimum": 1}, "max_new_tokens": {"type": "integer", "minimum": 1},
        "lanes": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["label", "engine", "method", "by_clients"],
            "properties": {"label": {"type": "string"}, "engine": {"type": "string"}, "method": {"type": "string"},
                           "by_clients": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                          "additionalProperties": SUMMARY_SCHEMA}}}},
    },
}


def parse_load_table(data: bytes | str, name: str = "the load table") -> dict:
    """A load table from its JSON text, checked against SCHEMA and for a summary of every lane at every number of
    clients it lists (SpecvizError naming `name` and what is wrong when it is not one)."""
    table = parse_json(data, SCHEMA, name, "specviz load table (scripts/load_table.py --json-out)")
    for lane in table["lanes"]:
        missing = [n for n in table["clients"] if str(n) not in lane["by_clients"]]
        if missing:
            raise SpecvizError(f"{name} is not a full load table: lane {lane['label']!r} has no results for "
                               f"{', '.join(map(str, missing))} client(s)")
    return table


def load_load_table(path: str | os.PathLike | None = None) -> dict | None:
    """The load table at `path` (SHIPPED by default), checked; None when there is none."""
    path = Path(path or SHIPPED)
    if not path.exists():
        return None
    try:
        text = path.read_bytes()
    except OSError as err:
        raise SpecvizError(f"cannot read the load table {path}: {err}") from err
    return parse_load_table(text, str(path))
