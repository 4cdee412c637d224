"""Tiny random-weight models and a character tokenizer, built in-process for fast tests."""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

EOS = 0


class TinyTokenizer:
    """Token i <-> one character; id 0 is the end-of-sequence token (pass eos=None for none)."""

    chat_template = None
    alphabet = "~abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?;:'()-+*/=<>[]{}@#$%&_|"

    def __init__(self, vocab_size: int, eos: int | None = EOS):
        self.vocab_size = vocab_size
        self.eos_token_id = eos

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + self.alphabet.index(c) % (self.vocab_size - 1) if c in self.alphabet else 1 for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if (i == EOS and skip_special_tokens) else self.alphabet[i % len(self.alphabet)] for i in ids)

    def get_vocab(self):
        return {self.alphabet[i % len(self.alphabet)] + str(i): i for i in range(self.vocab_size)}

    def __len__(self):
        return self.vocab_size


def tiny_llama(vocab_size=64, hidden=32, layers=2, seed=0, scale=1.0, max_positions=256, eos=EOS) -> LlamaForCausalLM:
    """A random LlamaForCausalLM; `scale` multiplies the LM head to make its distributions sharper or flatter."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=EOS,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=EOS)
    model.requires_grad_(False)
    return model


def hf_greedy(model, prompt_ids, max_new_tokens):
    """The target alone, through transformers' own generate(): the reference for greedy identity."""
    out = model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
    )
    return out[0, len(prompt_ids):].tolist()


def decode_settings(max_new_tokens: int = 64, sampling=None, **fields):
    """A DecodeSettings, with the sampling given as one specviz.decoding.sampling.Sampling if at all."""
    from specviz.decoding.settings import DecodeSettings

    if sampling is not None:
        fields.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    return DecodeSettings(max_new_tokens, **fields)
