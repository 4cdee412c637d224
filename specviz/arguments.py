"""Command-line options several commands share (generate, bench, serve): the model to load, and the decode settings
(named after DecodeSettings' fields). Below every command family, so that none of them imports another."""
from __future__ import annotations

import argparse

from specviz.decoding.settings import DECODE_FIELDS, FIELD_HELP, FIELD_TYPES, DecodeSettings
from specviz.errors import SpecvizError
from specviz.models.quantized import CHOICES as WEIGHT_CHOICES

DEFAULT_MODEL = "smollm2-135m"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="preset name, local folder or hub id (default: %(default)s)")
    parser.add_argument("--draft-model", default=None, help="draft model for --drafter draft (preset's own by default)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    add_weights_arg(parser)


def add_weights_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", default="auto", choices=WEIGHT_CHOICES,
                        help="the target's projections: q4q8: the preset GGUF's own 4-bit blocks, multiplied in "
                             "integers on 8-bit activations; q4: the same blocks on fp32 activations; fp32: the "
                             "GGUF's values widened to fp32 at fetch; auto: q4q8 for a preset on the CPU in "
                             "float32, else fp32 (default: %(default)s)")


def add_decoding_args(parser: argparse.ArgumentParser, defaults: DecodeSettings = DecodeSettings(), drafter: bool = True) -> None:
    """The fields of DecodeSettings as options, named after them (n_top stays the library's default)."""
    if drafter:
        parser.add_argument("--drafter", default=None, help="a drafter (`specviz drafters` lists them), optionally "
                            "with options: eagle2:total_tokens=16:draft_vocab=full, eagle3:head=FOLDER (default: the "
                            "backend's own: ngram on our engine; an engine that drafts as it was started takes none)")
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

