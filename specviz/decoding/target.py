"""The target model as the loop uses it: one forward over new tokens gives the logits and the features."""
from __future__ import annotations

import torch

from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder
from specviz.kernels.kvcache import new_cache
from specviz.models.compat import logit_postprocessing


class Target:
    """The target model split into its decoder and LM head, so one forward gives both the logits and the
    features (the hidden states that enter the LM head) that EAGLE drafts from."""

    def __init__(self, model, vocab_size: int | None = None):
        postprocessing = logit_postprocessing(model.config)  # the split would be wrong for such models
        if postprocessing is not None:
            raise SpecvizError(f"unsupported target: its logits are post-processed ({postprocessing}); specviz needs logits = lm_head(hidden)")
        self.model = model
        self.decoder = model.get_decoder()
        self.fast = fastdecoder.for_model(model)  # None: transformers' own forward (see specviz/fastdecoder.py)
        self.head = model.get_output_embeddings()
        self.device = model.device
        self.vocab_size = vocab_size  # ids past it (padding rows a draft lacks) are never generated
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 2**31

    def new_cache(self):
        """An empty KV cache of the kind `forward` fills."""
        return new_cache(self.fast, self.model.config)

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, position_ids=None, mask=None, logits=True):
        """ids of T new tokens → hidden (T, H) and logits (T, V) as float32 (None when logits=False).
        cache: from `new_cache()`."""
        if self.fast is not None:
            hidden = self.fast(torch.tensor(ids, device=self.device), cache, position_ids, mask)
        else:
            hidden = self.decoder(
                input_ids=torch.tensor([ids], device=self.device),
                cache=cache,
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=True,
            ).last_hidden_state[0]
        if not logits:
            return hidden, None
        return hidden, self.head(hidden)[:, : self.vocab_size].float()
