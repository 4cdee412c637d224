"""One decode configuration: what the engine, the Python API, the CLI, the service, the bench and the app all pass
around. Its fields are written here once; the CLI's options, the service's request body and the app's sidebar are
derived from them (`FIELD_HELP`, `DECODE_FIELDS`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any

from specviz.decoding.sampling import Sampling
from specviz.errors import SpecvizError


def _setting(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = _setting(64, "tokens to add after the prompt at most")
    temperature: float = _setting(0.0, "0 = greedy (argmax), where every drafter's output equals `none`'s")
    top_p: float = _setting(1.0, "nucleus cut: keep the most likely tokens up to this much probability (1 = no cut)")
    top_k: int = _setting(0, "keep the k most likely tokens (0 = no top-k cut)")
    k: int = _setting(4, "draft length of the chain drafters (a drafter's own k= option wins)")
    seed: int = _setting(0, "every random draw of a run (sampling, the acceptance test's u) comes from it")
    n_top: int = _setting(5, "top-N kept in events for p, q and residuals (0: none)")

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise SpecvizError(f"max_new_tokens must be a whole number > 0, got {self.max_new_tokens!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise SpecvizError(f"k (draft length) must be a whole number >= 1, got {self.k!r}")
        if self.n_top < 0:
            raise SpecvizError(f"n_top must be >= 0, got {self.n_top}")
        self.sampling  # checks temperature, top_p and top_k

    @functools.cached_property
    def sampling(self) -> Sampling:
        """The logit processing that p and q both go through (built and checked once per settings object)."""
        return Sampling(self.temperature, self.top_p, self.top_k)

    def decode_settings(self) -> DecodeSettings:
        """Only the decode fields (of a subclass that adds its own, such as the bench's)."""
        return DecodeSettings(**{name: getattr(self, name) for name in DECODE_FIELDS})


DECODE_FIELDS = tuple(f.name for f in fields(DecodeSettings))
FIELD_TYPES = {f.name: {"int": int, "float": float}[str(f.type)] for f in fields(DecodeSettings)}  # annotations are strings here
FIELD_HELP = {f.name: f.metadata["help"] for f in fields(DecodeSettings)}
