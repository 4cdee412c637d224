"""KV-cache surgery after verification: drop rejected positions, keep an accepted tree path.

Works on transformers' DynamicCache and on specviz.kernels.fastdecoder.KVCache (which does the same in place)."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specviz.kernels.fastdecoder import KVCache


def new_cache(fast, config):
    """An empty cache for a model run by `fast` (a specviz.kernels.fastdecoder path), or transformers' DynamicCache
    where there is none."""
    return fast.new_cache() if fast is not None else DynamicCache(config=config)


def crop_cache(cache, length: int) -> None:
    """Drop cached positions from `length` on (rejected draft tokens)."""
    if isinstance(cache, KVCache):
        cache.crop(length)
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def keep_cache_entries(cache, past_len: int, keep: list[int]) -> None:
    """After a verify forward over root + nodes, keep the cache entries of the root and of `keep` (node indices
    of the accepted path) only. A chain's accepted path is a prefix, so that is a crop."""
    if isinstance(cache, KVCache):
        cache.keep(past_len, keep)
        return
    if keep == list(range(len(keep))):
        crop_cache(cache, past_len + 1 + len(keep))
        return
    index = torch.tensor([past_len] + [past_len + 1 + i for i in keep])
    for layer in cache.layers:
        for name in ("keys", "values"):
            kv = getattr(layer, name)  # (B, heads, S, head_dim)
            kept = kv.index_select(2, index.to(kv.device))
            setattr(layer, name, torch.cat([kv[:, :, :past_len], kept], dim=2))
