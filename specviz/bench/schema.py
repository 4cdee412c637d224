"""The bench report's JSON schema, and reading a report back (the Benchmarks page loads saved ones)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from specviz.bench.peers import PEERS
from specviz.bench.report import SCHEMA_VERSION
from specviz.drafters.base import PLAIN
from specviz.errors import SpecvizError

_NUMBER = {"type": "number"}
_NULLABLE_NUMBER = {"type": ["number", "null"]}
_SUMMARY = {
    "type": ["object", "null"],
    "required": ["median", "min", "max", "n"],
    "properties": {"median": _NUMBER, "min": _NUMBER, "max": _NUMBER, "n": {"type": "integer", "minimum": 1}},
}
_MISMATCH = {
    "type": "object",
    "required": ["prompt", "index", "expected", "got", "expected_tokens", "got_tokens"],
    "properties": {"prompt": {"type": "string"}, "index": {"type": "integer"}, "expected": {"type": ["integer", "null"]},
                   "got": {"type": ["integer", "null"]}, "expected_tokens": {"type": "integer"}, "got_tokens": {"type": "integer"}},
}
_NUMERICS_EVENT = {  # a mismatch at a floating-point near-tie (specviz/bench/numerics.py)
    "type": "object",
    "required": [*_MISMATCH["required"], "top", "gap", "tolerance", "near_tie"],
    "properties": {**_MISMATCH["properties"], "gap": _NUMBER, "tolerance": _NUMBER, "near_tie": {"const": True},
                   "top": {"type": "array", "minItems": 2, "maxItems": 2,  # [[token id, logit], [token id, logit]]
                           "items": {"type": "array", "prefixItems": [{"type": "integer"}, _NUMBER], "minItems": 2, "maxItems": 2}}},
}
_SPEED = {"new_tokens": {"type": "integer"}, "wall_s": _NUMBER, "tokens_per_s": _NUMBER, "ms_per_token": _NULLABLE_NUMBER}
_CURVE = {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": _NUMBER}

_VLLM = {  # the report's optional "vllm" section (specviz/bench/vllm.py)
    "type": "object",
    "required": ["lanes", "ours_over"],
    "properties": {
        "lanes": {"type": "object", "additionalProperties": {
            "type": "object",
            "required": ["url", "model", "speculative", "tokens_per_s", "ms_per_token", "tau", "acceptance_rate",
                         "per_position_acceptance", "speedup_vs_none", "outputs_equal_none", "parted_from_none"],
            "properties": {**_SPEED, "url": {"type": "string"}, "model": {"type": "string"},
                           "speculative": {"type": ["boolean", "null"]}, "steps": {"type": "integer"}, "tau": _NUMBER,
                           "drafted": {"type": "integer"}, "accepted": {"type": "integer"},
                           "acceptance_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                           "per_position_acceptance": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
                           "acceptance_histogram": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                           "speedup_vs_none": _SUMMARY, "outputs_equal_none": {"type": ["integer", "null"]},
                           "parted_from_none": {"type": "array", "items": {"type": "object"}}}}},
        "ours_over": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": _SUMMARY}},
    },
}

_LLAMA_SERVER = {  # the report's optional "llama_server" section (specviz/bench/llamaserver.py)
    "type": "object",
    "required": ["lanes", "ours_over"],
    "properties": {
        "lanes": {"type": "object", "additionalProperties": {
            "type": "object",
            "required": ["spec_type", "options", "threads", "command", "tokens_per_s", "tau", "acceptance_rate",
                         "llamacpp_mean_length", "per_position_acceptance", "speedup_vs_none", "outputs_equal_none",
                         "parted_from_none"],
            "properties": {**_VLLM["properties"]["lanes"]["additionalProperties"]["properties"],  # type: ignore[index]
                           "spec_type": {"type": "string"}, "options": {"type": "object"},
                           "threads": {"type": "integer", "minimum": 1}, "command": {"type": "string"},
                           "llamacpp_mean_length": _NULLABLE_NUMBER,
                           # llama.cpp's own timing (its response's `timings`), per prompt: median (min–max), or null
                           "server_tokens_per_s": _SUMMARY, "server_prompt_tokens_per_s": _SUMMARY}}},
        "ours_over": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": _SUMMARY}},
    },
}

BENCH_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specviz bench report",
    "type": "object",
    "required": ["schema_version", "machine", "config", "prompts", "drafters", "peers", "head_to_head",
                 "outputs_match_none", "mismatching_prompts", "verify_cost_ms", "tree_verify_cost_ms",
                 "predicted_speedup", "floor_ms_per_token", "floor", "runs"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "machine": {
            "type": "object",
            "required": ["cpu", "cores", "torch", "transformers", "device", "dtype", "bandwidth_gb_s", "date"],
            "properties": {"cpu": {"type": "string"}, "cores": {"type": ["integer", "null"]}, "torch_threads": {"type": "integer"},
                           "gpu": {"type": ["string", "null"]}, "torch": {"type": "string"}, "transformers": {"type": "string"},
                           "device": {"type": "string"}, "dtype": {"type": "string"}, "bandwidth_gb_s": _NUMBER,
                           "date": {"type": "string"}, "weights": {"enum": ["fp32", "q4", "q4q8"]},
                           "draft_dtypes": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "config": {
            "type": "object",
            "required": ["command", "model", "drafters", "peers", "n_prompts", "max_new_tokens", "temperature", "top_p",
                         "seed", "repeats", "k", "verify_sizes", "context_len"],
            "properties": {"command": {"type": "string"}, "model": {"type": "string"},
                           "draft_model": {"type": ["string", "null"]},
                           "drafters": {"type": "array", "items": {"type": "string"}},
                           "peers": {"type": "array", "items": {"enum": list(PEERS)}},
                           "n_prompts": {"type": "integer", "minimum": 1}, "max_new_tokens": {"type": "integer"},
                           "temperature": _NUMBER, "top_p": _NUMBER, "top_k": {"type": "integer"}, "seed": {"type": "integer"},
                           "repeats": {"type": "integer", "minimum": 1}, "k": {"type": "integer", "minimum": 1},
                           "verify_sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                           "context_len": {"type": "integer"}},
        },
        "prompts": {
            "type": "array",
            "items": {"type": "object", "required": ["id", "prompt_tokens", "output_tokens", "output_preview"],
                      "properties": {"id": {"type": "string"}, "prompt_tokens": {"type": "integer"},
                                     "output_tokens": {"type": "integer"}, "output_preview": {"type": "string"}}},
        },
        "drafters": {
            "type": "object",
            "required": [PLAIN],
            "additionalProperties": {
                "type": "object",
                "required": ["tau", "acceptance_rate", "per_position_acceptance", "tokens_per_s", "ms_per_token",
                             "draft_share", "speedup_vs_none", "outputs_match_none", "mismatches"],
                "properties": {
                    **_SPEED,
                    "steps": {"type": "integer"}, "tau": _NUMBER, "drafted": {"type": "integer"}, "accepted": {"type": "integer"},
                    "acceptance_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                    "per_position_acceptance": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
                    # optional: reports written before they existed lack the histogram and the numerics events
                    "acceptance_histogram": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "numerics_events": {"type": "array", "items": _NUMERICS_EVENT},
                    "draft_share": _NUMBER, "verify_share": _NUMBER, "draft_ms_per_step": _NUMBER,
                    "verify_ms_per_step": _NUMBER, "inputs_per_step": _NUMBER, "tree": {"type": "boolean"},
                    "speedup_vs_none": _SUMMARY,
                    "outputs_match_none": {"type": ["boolean", "null"]},
                    "mismatches": {"type": "array", "items": _MISMATCH},
                },
            },
        },
        "peers": {
            "type": "object",
            "propertyNames": {"enum": list(PEERS)},
            "additionalProperties": {
                "type": "object",
                "required": ["tokens_per_s", "ms_per_token", "speedup_vs_generate", "outputs_match_generate", "mismatches"],
                "properties": {**_SPEED, "speedup_vs_generate": _SUMMARY, "outputs_match_generate": {"type": ["boolean", "null"]},
                               "mismatches": {"type": "array", "items": _MISMATCH}},
            },
        },
        "head_to_head": {
            "type": "array",
            "items": {"type": "object", "required": ["ours", "peer", "speedup"],
                      "properties": {"ours": {"type": "string"}, "peer": {"enum": list(PEERS)}, "speedup": _SUMMARY}},
        },
        "llama_cpp": {  # optional: reports written without the llama.cpp peers lack it
            "type": "object",
            "required": ["available", "reason"],
            "properties": {
                "available": {"type": "boolean"},
                "reason": {"type": ["string", "null"]},
                "methods": {
                    "type": "object",
                    "required": ["llama_cpp", "llama_cpp_lookup"],
                    "properties": {
                        "llama_cpp": {"type": "object", "required": ["tokens_per_s", "outputs_equal_none", "parted_from_none"],
                                      "properties": {**_SPEED, "outputs_equal_none": {"type": ["integer", "null"]},
                                                     "parted_from_none": {"type": "array", "items": _MISMATCH}}},
                        "llama_cpp_lookup": {"type": "object", "required": ["tokens_per_s", "speedup_vs_plain", "outputs_match_plain"],
                                             "properties": {**_SPEED, "speedup_vs_plain": _SUMMARY,
                                                            "outputs_match_plain": {"type": ["boolean", "null"]},
                                                            "mismatches": {"type": "array", "items": _MISMATCH}}},
                    },
                },
                "ours_over": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["llama_cpp", "llama_cpp_lookup"],
                    "properties": {"llama_cpp": _SUMMARY, "llama_cpp_lookup": _SUMMARY}}},
            },
        },
        "vllm": _VLLM,  # optional: reports of runs without vLLM lanes lack it
        "llama_server": _LLAMA_SERVER,  # optional: reports of runs without llama-server lanes lack it
        "outputs_match_none": {"type": ["boolean", "null"]},
        "mismatching_prompts": {"type": "array", "items": {"type": "string"}},
        "verify_cost_ms": _CURVE,
        "tree_verify_cost_ms": _CURVE,
        "predicted_speedup": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["tau", "inputs_per_step", "draft_ms_per_step", "verify_ms_per_step_curve", "predicted", "measured"],
                "properties": {"tau": _NUMBER, "inputs_per_step": _NUMBER, "draft_ms_per_step": _NUMBER,
                               "verify_ms_per_step_curve": _NUMBER, "verify_ms_per_step_measured": _NUMBER,
                               "other_ms_per_step": _NUMBER, "predicted": _NUMBER, "measured": _NULLABLE_NUMBER},
            },
        },
        "floor_ms_per_token": _NUMBER,
        "floor": {
            "type": "object",
            "required": ["weight_bytes", "bandwidth_gb_s", "floor_ms_per_token", "floor_tokens_per_s", "none_ms_per_token"],
            "properties": {"weight_bytes": {"type": "integer"}, "bandwidth_gb_s": _NUMBER, "floor_ms_per_token": _NUMBER,
                           "floor_tokens_per_s": _NUMBER, "none_ms_per_token": _NULLABLE_NUMBER,
                           "forward_1_ms": _NULLABLE_NUMBER, "none_share_of_floor": _NULLABLE_NUMBER,
                           # (reports written by earlier versions have one bandwidth figure for the whole run)
                           "bandwidth_gb_s_range": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                           "bandwidth_samples": {"type": "integer", "minimum": 1},
                           "bandwidth_by_prompt": {"type": "object", "additionalProperties": {"type": "array", "items": _NUMBER}},
                           "none_share_of_floor_per_prompt": _SUMMARY,
                           "none_share_of_floor_totals": _NULLABLE_NUMBER},
        },
        "runs": {
            "type": "array",
            "items": {"type": "object", "required": ["prompt", "method", "repeat", "new_tokens", "wall_s", "tokens_per_s"],
                      "properties": {"prompt": {"type": "string"}, "method": {"type": "string"},
                                     "repeat": {"type": "integer"}, "new_tokens": {"type": "integer"},
                                     "wall_s": _NUMBER, "tokens_per_s": _NUMBER}},
        },
    },
}


def validate(report: dict) -> None:
    """Raise jsonschema.ValidationError when the report does not match BENCH_SCHEMA."""
    from specviz.schemacheck import check

    check(report, BENCH_SCHEMA)


def parse_json(text: str | bytes, schema: dict, source: str, kind: str) -> dict:
    """JSON text checked against a JSON Schema; SpecvizError naming `source`, the `kind` of file expected and where
    it departs from it when it is not one."""
    import jsonschema

    from specviz.schemacheck import check

    try:
        document = json.loads(text)
        check(document, schema)
    except UnicodeDecodeError:
        raise SpecvizError(f"{source} is not a text file") from None
    except json.JSONDecodeError as err:
        raise SpecvizError(f"{source} is not JSON: {err}") from err
    except jsonschema.ValidationError as err:
        where = "/".join(map(str, err.absolute_path)) or "the top level"
        raise SpecvizError(f"{source} is not a {kind} (at {where}: {err.message})") from err
    return document


def parse_report(text: str | bytes, source: str = "the report") -> dict:
    """A report from its JSON text, checked against the schema (SpecvizError when it is not one)."""
    return parse_json(text, BENCH_SCHEMA, source, "specviz bench report")


def load_report(path: str | os.PathLike) -> dict:
    """Read a saved report and check it against the schema (SpecvizError when it is not one)."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise SpecvizError(f"cannot read the bench report {path}: {err}") from err
    return parse_report(text, str(path))
