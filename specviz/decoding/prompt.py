"""A prompt (a string, or a conversation of {role, content} messages) as the token ids the engine decodes after."""
from __future__ import annotations

from typing import Any

from specviz.errors import SpecvizError


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, str]] | list[int], chat: bool = True) -> list[int]:
    """Token ids of the prompt; instruct models get their chat template unless chat=False. `prompt` may also be
    a conversation, [{"role": "user" | "assistant" | "system", "content": "..."}, ...] (chat template required), or
    token ids, taken as they are."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [t for t in prompt if isinstance(t, int)]  # token ids already: decoded after as they are
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
            raise SpecvizError("a conversation is a non-empty list of {role, content} messages")
        if not getattr(tokenizer, "chat_template", None):
            raise SpecvizError("this model has no chat template: send a prompt string instead of messages")
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])
