"""One decode configuration: what the engine, the Python API, the CLI, the bench and the app all pass around."""
from __future__ import annotations

from dataclasses import dataclass, fields

from specviz.decoding.sampling import Sampling
from specviz.errors import SpecvizError


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    k: int = 4  # draft length of the chain drafters (a drafter's own k= option wins)
    seed: int = 0  # every random draw of a run (sampling, the acceptance test's u) comes from it
    n_top: int = 5  # top-N kept in events for p, q and residuals

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise SpecvizError(f"max_new_tokens must be a whole number > 0, got {self.max_new_tokens!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise SpecvizError(f"k (draft length) must be a whole number >= 1, got {self.k!r}")
        if self.n_top < 0:
            raise SpecvizError(f"n_top must be >= 0, got {self.n_top}")
        self.sampling  # checks temperature, top_p and top_k

    @property
    def sampling(self) -> Sampling:
        """The logit processing that p and q both go through."""
        return Sampling(self.temperature, self.top_p, self.top_k)

    def decode_settings(self) -> DecodeSettings:
        """Only the decode fields (of a subclass that adds its own, such as the bench's)."""
        return DecodeSettings(**{f.name: getattr(self, f.name) for f in fields(DecodeSettings)})


DECODE_FIELDS = tuple(f.name for f in fields(DecodeSettings))
