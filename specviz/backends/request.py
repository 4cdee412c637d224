"""A run as every backend takes it: what to decode, with which drafter and settings, built once by whoever asks
(the API, the CLI, the app, the bench, the service) and handed to `Backend.stream` as it is.

    run = Run.of("Explain KV caches.", drafter="eagle2:lookup=4", max_new_tokens=64)
    run.drafter, run.drafter_options  # 'eagle2', {'lookup': 4}: the drafter string parsed here, once

Where the drafter is one of ours (specviz.drafters.REGISTRY), its options are checked against its spec here; another
engine's drafter ("vllm") is left to that engine. `served=True` checks them as a `specviz serve` service checks
what its clients send: only the options a client may set, within their `high`, and no text a message would echo
at length."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Union

from specviz.decoding.settings import DECODE_FIELDS, DecodeSettings
from specviz.drafters import REGISTRY, check_named, parse_spec
from specviz.drafters.spec import K
from specviz.errors import SpecvizError, shown

Prompt = Union[str, list[dict[str, str]]]  # a text, or chat messages ({"role": ..., "content": ...})
RunPrompt = Union[Prompt, list[int]]  # or token ids, taken as they are (the bench's)
DRAFTER_CHARS = 256  # a served drafter with its options ("eagle2:total_tokens=16:lookup=4" is 32)
OPTION_CHARS = 32  # a served drafter option's name or text value


@dataclass(frozen=True)
class Run:
    """One run, as a backend decodes it. Build it with `Run.of`, which parses and checks the drafter once."""

    prompt: RunPrompt
    drafter: str | None = None  # the registry name, without options; None: the backend's own default
    drafter_options: dict[str, Any] = field(default_factory=dict)  # the drafter string's, then the explicit ones
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    chat: bool = True  # a text prompt goes through the chat template (False: as it is)
    client_id: str | None = None  # the viewer, for a remote engine's per-client limits
    model: str | None = None  # which of a service's models decodes it; None: the one the backend was opened for
    detail: bool = True  # False: no tree-building stages and no top-N lists in the events (throughput runs)

    @classmethod
    def of(cls, prompt: RunPrompt, drafter: str | None = None, drafter_options: Mapping[str, Any] | None = None,
           settings: DecodeSettings | None = None, chat: bool = True, client_id: str | None = None, *,
           model: str | None = None, detail: bool = True, served: bool = False, **decode: Any) -> Run:
        """The run of `prompt`. drafter: a name with options ("eagle2:lookup=4"), parsed here; drafter_options
        override the string's. settings: a DecodeSettings (default: its defaults) whose fields `decode` replace
        by name. detail False also keeps no top-N lists (n_top 0). served: checked as a service checks a client's
        request (the drafter first, so a served k is held to the drafter's bounds before the settings are)."""
        base = settings.decode_settings() if settings is not None else DecodeSettings()
        name, options = drafter_of(drafter, drafter_options, decode.get("k", base.k), served)
        settings = settings_of(base, decode)
        if not detail:
            settings = replace(settings, n_top=0)
        return cls(prompt, name, options, settings, chat, client_id, model, detail)

    def drafter_string(self) -> str | None:
        """The drafter as one string, "name:key=value:key=value" (parse_spec's form; None for the backend's own):
        what a Start event or a message names. Text values that read as numbers or hold ':' do not parse back."""
        if self.drafter is None:
            return None
        return ":".join([self.drafter] + [f"{key}={_text(value)}" for key, value in self.drafter_options.items()])

    def with_defaults(self, options: Mapping[str, Any]) -> Run:
        """The run with `options` for its drafter where it sets none itself (the app's tree settings under an
        `eagle2:lookup=4` variant's own), checked as Run.of checks them."""
        merged = {**options, **self.drafter_options}
        if self.drafter in REGISTRY:
            check_named(self.drafter, merged)
        return replace(self, drafter_options=merged)


def settings_of(settings: DecodeSettings | None, decode: Mapping[str, Any]) -> DecodeSettings:
    """`settings` (default: DecodeSettings()) with any of its fields given by name in `decode` replaced."""
    unknown = sorted(set(decode) - set(DECODE_FIELDS))
    if unknown:
        raise TypeError(f"unknown argument(s) {', '.join(unknown)}; the decode settings are: {', '.join(DECODE_FIELDS)}")
    return replace(settings or DecodeSettings(), **decode)


def drafter_of(drafter: str | None, options: Mapping[str, Any] | None, k: int = DecodeSettings.k,
               served: bool = False) -> tuple[str | None, dict[str, Any]]:
    """(the registry name, the merged options) of a drafter string and explicit options, parsed once and checked
    against the drafter's spec where it is one of ours; k: the run's decode setting k (held to K's bounds where
    served). A drafter of None keeps its options for the backend's own default to check."""
    options = dict(options or {})
    if drafter is None:
        return None, options
    if served:
        check_text("drafter", drafter)
        if len(drafter) > DRAFTER_CHARS:
            raise SpecvizError(f"a drafter with its options is at most {DRAFTER_CHARS} characters here, got "
                               f"{shown(drafter)}")
        check_sent(options)
    try:
        name, spec_options = parse_spec(drafter)
    except SpecvizError:
        if not served:
            raise
        raise SpecvizError(f"drafter {shown(drafter)} is not NAME or NAME:KEY=VALUE:KEY=VALUE...") from None
    merged = {**spec_options, **options}
    spec = REGISTRY.get(name)
    if served:
        check_sent(merged)
        if spec is not None:
            takes = [o.name for o in spec.options if o.served] + ["k_policy"]  # every drafter takes it, as locally
            unknown = sorted(set(merged) - set(takes))
            if unknown:  # said here, so that the names a client sent are echoed within ECHO_CHARS in all
                raise SpecvizError(f"{name} option(s) {shown(', '.join(unknown))} are not offered by the service; "
                                   f"it takes: {', '.join(takes)}")
            K.check(name, merged.get("k", k), served=True)
    if spec is not None:
        check_named(name, merged, served)
    return name, merged


def check_text(what: str, text: str) -> None:
    """Text an engine will tokenize or print: valid Unicode (JSON can carry lone surrogates, UTF-8 cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise SpecvizError(f"{what} is not valid Unicode text: it holds a lone surrogate (U+D800-U+DFFF) at "
                           f"character {err.start:,}") from None


def check_sent(options: Mapping[str, Any]) -> None:
    """What no drafter option a service's client sends may be, whatever its spec says: a folder on the server, text
    that is not Unicode or is long, a number that is not finite."""
    if "head" in options:
        raise SpecvizError("drafter option head= names a folder on the server; the service runs only the heads it "
                           "loaded")
    for key, value in options.items():
        check_text("a drafter option's name", key)
        if len(key) > OPTION_CHARS or (isinstance(value, str) and len(value) > OPTION_CHARS):
            raise SpecvizError(f"drafter option {shown(key)}: names and values are at most {OPTION_CHARS} characters")
        if isinstance(value, str):
            check_text(f"drafter option {shown(key)}", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecvizError(f"drafter option {shown(key)} must be a finite number, got {value}")


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
