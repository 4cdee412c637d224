"""The target model as the loop uses it: one forward over new tokens gives the logits and the features."""
from __future__ import annotations

from typing import Any, Literal, overload

import torch

from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder, quant
from specviz.kernels.kvcache import new_cache
from specviz.models.compat import logit_postprocessing


class Target:
    """The target model split into its decoder and LM head, so one forward gives both the logits and the
    features (the hidden states that enter the LM head) that EAGLE drafts from."""

    def __init__(self, model: Any, vocab_size: int | None = None):
        postprocessing = logit_postprocessing(model.config)  # the split would be wrong for such models
        if postprocessing is not None:
            raise SpecvizError(f"unsupported target: its logits are post-processed ({postprocessing}); specviz needs logits = lm_head(hidden)")
        self.model = model
        self.decoder = model.get_decoder()
        self.fast = fastdecoder.for_model(model)  # None: transformers' own forward (see specviz/fastdecoder.py)
        self.head = quant.q8_head(model) or model.get_output_embeddings()  # the GGUF's 8-bit head under --weights q4
        self.device = model.device
        self.vocab_size = vocab_size  # ids past it (padding rows a draft lacks) are never generated
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 2**31

    def new_cache(self) -> Any:
        """An empty KV cache of the kind `forward` fills."""
        return new_cache(self.fast, self.model.config)

    @overload
    def forward(self, ids: list[int], cache: Any, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, logits: Literal[True] = True,
                layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(self, ids: list[int], cache: Any, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, logits: Literal[False], layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, None]: ...

    @torch.inference_mode()
    def forward(self, ids: list[int], cache: Any, position_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                logits: bool = True, layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids of T new tokens → features (T, H) and logits (T, V) as float32 (None when logits=False).
        cache: from `new_cache()`. The features are the final hidden states (the LM head's input), or with
        `layers` the inputs of those decoder layers side by side, (T, len(layers) * H), what an EAGLE-3 head
        fuses; both from the one forward."""
        depth = self.model.config.num_hidden_layers
        if any(not 0 <= n < depth for n in layers):
            raise SpecvizError(f"feature layers {tuple(layers)} are not all layers of this {depth}-layer target")
        if self.fast is not None:
            out = self.fast(torch.tensor(ids, device=self.device), cache, position_ids, mask, layers=tuple(layers))
            hidden, features = out if layers else (out, out)
        else:
            out = self.decoder(
                input_ids=torch.tensor([ids], device=self.device),
                cache=cache,
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=bool(layers),
            )
            hidden = features = out.last_hidden_state[0]
            if layers:  # transformers' hidden_states[n] is the input of layer n
                features = torch.cat([out.hidden_states[n][0] for n in layers], dim=-1)
        if not logits:
            return features, None
        return features, self.head(hidden)[:, : self.vocab_size].float()
