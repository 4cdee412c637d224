"""Options several commands share: the model to load, and the decode settings (named after DecodeSettings' fields)."""
from __future__ import annotations

import argparse

from specviz.decoding.settings import DECODE_FIELDS, FIELD_HELP, FIELD_TYPES, DecodeSettings
from specviz.errors import SpecvizError

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_DRAFTER = "ngram"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="preset name, local folder or hub id (default: %(default)s)")
    parser.add_argument("--draft-model", default=None, help="draft model for --drafter draft (preset's own by default)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--weights", default="fp32", choices=("fp32", "q4"),
                        help="the target's projections: fp32 (dequantized at fetch), or q4: the preset GGUF's 4-bit "
                             "blocks kept 4-bit (CPU, float32; default: %(default)s)")


def add_decoding_args(parser: argparse.ArgumentParser, defaults: DecodeSettings = DecodeSettings(), drafter: bool = True) -> None:
    """The fields of DecodeSettings as options, named after them (n_top stays the library's default)."""
    if drafter:
        parser.add_argument("--drafter", default=DEFAULT_DRAFTER, help="a drafter (`specviz drafters` lists them), optionally "
                            "with options: eagle2:total_tokens=16:draft_vocab=full, eagle3:head=FOLDER")
    for name in DECODE_FIELDS:
        if name != "n_top":
            parser.add_argument(f"--{name.replace('_', '-')}", type=FIELD_TYPES[name], default=getattr(defaults, name),
                                help=FIELD_HELP[name])


def decode_settings(args) -> dict:
    """The DecodeSettings fields parsed by add_decoding_args, by name (their options are named after them)."""
    return {name: getattr(args, name) for name in DECODE_FIELDS if name != "n_top"}


def int_list(text: str, flag: str) -> tuple[int, ...]:
    """Comma-separated positive integers (a SpecvizError naming the flag otherwise)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SpecvizError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecvizError(f"{flag} takes integers >= 1, got {text!r}")
    return values

