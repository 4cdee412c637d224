"""What the service takes from a request: the request bodies (their decode fields read from DecodeSettings, not
written again here), the limits, and the checks that turn a body into a RunRequest (a specviz.backends.Run, built
by Run.of as every other caller builds one, its drafter checked as served) before anything is built or tokenized.
Every refusal is a ClientError whose message echoes at most a short prefix of what was sent."""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from specviz.backends.request import check_text, drafter_of
from specviz.decoding.prompt import encode_prompt
from specviz.decoding.settings import DECODE_FIELDS, FIELD_HELP, FIELD_TYPES, DecodeSettings
from specviz.drafters import DEFAULT, available
from specviz.drafters.spec import K
from specviz.errors import SpecvizError
from specviz.serve.guard import ClientError, problems, shown
from specviz.serve.runs import RunRequest

SEED_MAX = 2**64 - 1  # torch's generator takes a seed of 64 bits
# The smallest temperature above 0 (greedy) the service takes: logits / temperature must stay finite in float32
# (3.4e38) for logits of any size a model gives (|logit| < 1e3 leaves a wide margin); 0.01 already samples the
# argmax nearly always, so nothing is lost below it: send 0 for greedy.
TEMPERATURE_FLOOR = 0.01
TOP_K_MAX = 1_000_000  # more than any vocabulary: a larger top_k cuts nothing
CHAT_MAX_TOKENS = 256  # a chat request's default budget (OpenAI's field is optional), within the service's limit
TEMPLATE_TOKENS = 512  # room left for a chat template's own tokens (system prompt, role markers)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: the service's defence against a run that would hold the device for long."""

    max_new_tokens: int = 512
    max_prompt_chars: int = 32_000
    max_body_bytes: int = 256 * 1024
    max_n_top: int = 20


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


class RunParameters(BaseModel):
    """POST /v1/runs, besides the decode settings: what to decode, where, and how much detail to keep."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str | None = None
    messages: list[Message] | None = None  # instead of prompt: a conversation, through the chat template
    model: str | None = None  # one the service loaded (default: the first)
    drafter: str = DEFAULT  # a drafter with options, e.g. "eagle2:lookup=4"
    drafter_options: dict[str, int | float | bool | str] = Field(default_factory=dict)
    detail: bool = True  # False: leave out tree-building stages and top-N lists
    chat: bool = True  # False: the prompt as it is, without the chat template
    share: bool = False  # True: the run gets a read-only watch link (share_id) for any number of viewers


# POST /v1/runs: the parameters of specviz.stream, the fields of DecodeSettings among them
RunBody = create_model("RunBody", __base__=RunParameters, __doc__=RunParameters.__doc__, **{
    f.name: (FIELD_TYPES[f.name], Field(f.default, description=FIELD_HELP[f.name])) for f in fields(DecodeSettings)})


# OpenAI request fields that would change the completion, each with the values that change nothing: set to
# anything else, the request is refused rather than answered as if they were not there. Other fields (user,
# metadata, store, stream_options, ...) change nothing here and are ignored.
CHAT_UNSUPPORTED = {"n": (None, 1), "stop": (None, "", []), "logit_bias": (None, {}), "presence_penalty": (None, 0),
                    "frequency_penalty": (None, 0), "logprobs": (None, False), "top_logprobs": (None, 0),
                    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
                    "function_call": (None, "none"), "response_format": (None, {"type": "text"}),
                    "prediction": (None,), "audio": (None,), "modalities": (None, ["text"]),
                    "reasoning_effort": (None,), "web_search_options": (None,)}


class ChatBody(BaseModel):
    """POST /v1/chat/completions: OpenAI's request, `specviz` picking the drafter ({"drafter": "eagle2", "k":
    4}); OpenAI fields that would change the completion (CHAT_UNSUPPORTED) are refused, others ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    seed: int | None = None
    specviz: dict[str, int | float | bool | str] = Field(default_factory=dict)


def run_request(models: dict, body: RunBody, limits: Limits, default_model: str) -> RunRequest:
    """Check a request against the loaded models and the limits, building nothing; ClientError says what is
    wrong. Options that conflict with each other (ngram's min_ngram above max_ngram) are refused when the run
    starts: its stream then ends with an error event."""
    if (body.prompt is None) == (body.messages is None):
        raise ClientError("send either `prompt` (a string) or `messages` (a conversation), not both or neither")
    prompt = body.prompt if body.prompt is not None else [m.model_dump() for m in body.messages]
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    for i, text in enumerate(texts):
        check_text("the prompt" if isinstance(prompt, str) else f"messages[{i}].content", text)
    if not any(t.strip() for t in texts):
        raise ClientError("the prompt is empty" if isinstance(prompt, str) else "the conversation has no text")
    chars = sum(len(t) for t in texts)
    if chars > limits.max_prompt_chars:
        raise ClientError(f"the prompt has {chars:,} characters; this service takes at most {limits.max_prompt_chars:,}", 413)
    name = body.model or default_model
    check_text("model", name)
    if name not in models:
        raise ClientError(f"model {shown(name)} is not loaded here; this service runs only: {', '.join(models)} "
                          "(it never loads a path or a hub id from a request)", 404)
    check_numbers(body, limits)
    try:
        request = RunRequest.of(prompt, body.drafter, body.drafter_options, chat=body.chat, model=name,
                                detail=body.detail, served=True, **{f: getattr(body, f) for f in DECODE_FIELDS})
    except SpecvizError as err:
        raise ClientError(str(err)) from err
    check_offered(request.drafter or "", available(models[name]), name)
    return request


def served_drafter(drafter: str, options: dict, offered: list[str], model: str = "this model",
                   k: int = K.default) -> tuple[str, dict]:
    """A drafter with options as a client sent them ("eagle2:lookup=4" and {"depth": 5}) and the decode setting
    k, checked as RunRequest.of checks them (served) and against the drafters `offered`, building nothing: (its
    name, the options)."""
    try:
        name, merged = drafter_of(drafter, options, k, served=True)
    except SpecvizError as err:
        raise ClientError(str(err)) from err
    check_offered(name or "", offered, model)
    return name or "", merged


def check_offered(drafter: str, offered: list[str], model: str) -> None:
    """The drafter (a registry name) among those `offered` for the model (the ones it has loaded what they need for)."""
    if drafter not in offered:
        raise ClientError(f"drafter {shown(drafter)} is not available for {model}; available: {', '.join(offered)}")


def check_numbers(body: RunBody, limits: Limits) -> None:
    """The decode settings within what one request may ask of this service."""
    for name, value, low, high in (("max_new_tokens", body.max_new_tokens, 1, limits.max_new_tokens),
                                   ("n_top", body.n_top, 0, limits.max_n_top),
                                   ("seed", body.seed, 0, SEED_MAX),
                                   ("top_k", body.top_k, 0, TOP_K_MAX)):
        if not low <= value <= high:
            raise ClientError(f"{name} must be a whole number from {low} to {high:,} here, got {shown(value)}")
    for name in ("temperature", "top_p"):
        if not math.isfinite(getattr(body, name)):
            raise ClientError(f"{name} must be a finite number, got {shown(getattr(body, name))}")
    if 0 < body.temperature < TEMPERATURE_FLOOR:
        raise ClientError(f"temperature must be 0 (greedy) or at least {TEMPERATURE_FLOOR} here, got "
                          f"{body.temperature:g}: below it logits / temperature overflow")


def chat_run_body(body: ChatBody, default_drafter: str, limits: Limits) -> RunBody:
    """The run an OpenAI chat request asks for."""
    for name, value in (body.model_extra or {}).items():
        if name in CHAT_UNSUPPORTED and value not in CHAT_UNSUPPORTED[name]:
            raise ClientError(f"{name} is not supported by this service (it would change the completion); leave "
                              f"it out or send {CHAT_UNSUPPORTED[name][-1]!r}")
    extra = dict(body.specviz)
    drafter = extra.pop("drafter", default_drafter)
    k = extra.pop("k", DecodeSettings.k)
    if not isinstance(drafter, str):
        raise ClientError(f"specviz.drafter must be text such as \"ngram\", got {shown(drafter)}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise ClientError(f"specviz.k must be a whole number, got {shown(k)}")
    given = next((v for v in (body.max_completion_tokens, body.max_tokens) if v is not None), None)
    if given is not None and not 1 <= given <= limits.max_new_tokens:
        raise ClientError(f"max_tokens must be a whole number from 1 to {limits.max_new_tokens} here, got {shown(given)}")
    try:
        return RunBody(messages=body.messages, model=body.model, drafter=drafter, drafter_options=extra,
                       max_new_tokens=given or min(CHAT_MAX_TOKENS, limits.max_new_tokens),
                       temperature=float(body.temperature), top_p=float(body.top_p), seed=body.seed or 0, k=k,
                       n_top=0, detail=False)
    except ValidationError as err:  # what the 422 of a bad body says (each client's key cut short)
        raise ClientError(f"bad request: {problems(err.errors())}", 422) from err


@dataclass(frozen=True)
class TokenBounds:
    """What a tokenizer can give a prompt, known without tokenizing it: its longest token in UTF-8 bytes (a text
    of B bytes is at least B / longest tokens), the fewest and most tokens its chat template adds per message, and,
    for a byte-level BPE tokenizer that normalises nothing (SmolLM2's, Qwen's), what each byte tells:
    `byte_weight[b]` is 1 / the byte length of the longest token holding byte b, and `joins[a * 256 + b]` says
    whether any token holds byte a followed by byte b. A token of m bytes holds m bytes of weight at most 1/m each,
    so a text has at least as many tokens as its weights add up to; and a token ends between two bytes no token
    holds side by side, so each run between such places takes at least the ceiling of its own weights."""

    longest_token_bytes: int
    message_min: int
    message_max: int
    byte_weight: np.ndarray | None = None  # (256,) float64; 0 for a byte no token holds
    joins: np.ndarray | None = None  # (65536,) bool


WEIGHT_SLACK = 1e-3  # a run's weights summed in float64 are within far less of their exact sum: never round up past it


@functools.lru_cache(maxsize=8)  # per tokenizer (by identity): the service loads a few models at most
def token_bounds(tokenizer) -> TokenBounds:
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    longest = max((len(token.encode("utf-8")) for token in vocab), default=2**31)  # none known: no bound from it
    counts = []
    if getattr(tokenizer, "chat_template", None):
        for role in ("system", "user", "assistant"):
            try:  # the tokens a second empty message of this role adds
                one, two = ([{"role": role, "content": ""}] * n for n in (1, 2))
                counts.append(len(encode_prompt(tokenizer, two)) - len(encode_prompt(tokenizer, one)))
            except Exception:  # a template that refuses such a conversation: no bound from it
                counts.append(0)
    weight, joins = byte_bounds(tokenizer, vocab)
    return TokenBounds(max(longest, 1), max(min(counts, default=0), 0), max(max(counts, default=0), 0), weight, joins)


def byte_bounds(tokenizer, vocab: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
    """TokenBounds.byte_weight and .joins from the vocabulary, for a byte-level BPE tokenizer with no normaliser
    (each token is then bytes of the text as they are); (None, None) for any other."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        config = json.loads(backend.to_str()) if backend is not None else {}
    except Exception:
        config = {}
    byte_level = "ByteLevel" in json.dumps(config.get("pre_tokenizer")) and config.get("model", {}).get("type") == "BPE"
    if not byte_level or config.get("normalizer") is not None:
        return None, None
    inverse = {chr(c): b for b, c in byte_level_chars().items()}
    longest, pairs = [0] * 256, set()
    for token in vocab:  # its bytes through the byte-level alphabet, and as UTF-8 (an added token, "<|im_end|>")
        forms = {token.encode("utf-8")}
        if all(c in inverse for c in token):
            forms.add(bytes(inverse[c] for c in token))
        for raw in forms:
            for b in set(raw):
                longest[b] = max(longest[b], len(raw))
            pairs.update(zip(raw, raw[1:]))
    held = np.array(longest, dtype=np.float64)
    weight = np.divide(1.0, held, out=np.zeros(256), where=held > 0)
    joins = np.zeros((256, 256), dtype=bool)
    if pairs:
        first, second = zip(*pairs)
        joins[list(first), list(second)] = True
    joins[held == 0, :] = joins[:, held == 0] = True  # a byte no token holds may vanish: it ends no run
    return weight, joins.reshape(-1)


@functools.lru_cache(maxsize=1)
def byte_level_chars() -> dict[int, int]:
    """GPT-2's byte-level alphabet: byte -> the code point a byte-level vocabulary writes it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: b for b in printable}, **{b: 256 + i for i, b in enumerate(others)}}


def fewest_tokens(bounds: TokenBounds, text: str) -> int:
    """A number of tokens the tokenizer gives `text` at least, from its bytes alone (TokenBounds)."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    by_length = -(-len(data) // bounds.longest_token_bytes)
    if bounds.byte_weight is None or bounds.joins is None or len(data) == 0:
        return by_length
    ends = np.flatnonzero(~bounds.joins[data[:-1].astype(np.int32) * 256 + data[1:]]) + 1  # a token ends there
    runs = np.add.reduceat(bounds.byte_weight[data], np.concatenate(([0], ends)))
    return max(by_length, int(np.ceil(runs - WEIGHT_SLACK).clip(min=0).sum()))


def must_tokenize(models, request: RunRequest) -> bool:
    """The prompt plus max_new_tokens against the model's context from bounds alone (a ClientError when even
    the fewest tokens the prompt can be do not fit); True when only tokenizing it can tell. A text of B UTF-8
    bytes gives at most B tokens (byte-level BPE, and SentencePiece with byte fallback, give at most one token
    per byte) and at least fewest_tokens, and each message of a conversation adds what its chat template adds (a
    template may trim a message, so its fewest are counted without the spaces around it)."""
    limit = context_of(models)
    prompt, new = request.prompt, request.settings.max_new_tokens
    bounds = token_bounds(models.tokenizer)
    contents = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    messages = 0 if isinstance(prompt, str) else len(prompt)
    fewest = messages * bounds.message_min + sum(fewest_tokens(bounds, t.strip()) for t in contents)
    if fewest + new > limit:
        what = "the prompt" if isinstance(prompt, str) else f"the conversation ({messages:,} messages)"
        raise ClientError(f"{what} is at least {fewest:,} tokens, so with max_new_tokens ({new}) past "
                          f"{request.model}'s context of {limit} tokens")
    size = sum(len(t.encode("utf-8")) for t in contents)
    return size + messages * bounds.message_max + TEMPLATE_TOKENS + new > limit


def check_tokens(models, request: RunRequest) -> None:
    """The prompt, tokenized, plus max_new_tokens within the model's context (for a prompt must_tokenize could
    not tell)."""
    limit, prompt, new = context_of(models), request.prompt, request.settings.max_new_tokens
    try:
        ids = encode_prompt(models.tokenizer, prompt, request.chat)
    except SpecvizError as err:
        raise ClientError(str(err)) from err
    except Exception as err:  # a chat template refusing a conversation in its own way
        raise ClientError(f"the model's tokenizer refused the prompt ({type(err).__name__}: {shown(str(err))})") from err
    if len(ids) + new > limit:
        raise ClientError(f"the prompt ({len(ids)} tokens) + max_new_tokens ({new}) exceeds {request.model}'s "
                          f"context of {limit} tokens")


def check_context(models, request: RunRequest) -> None:
    """The prompt plus max_new_tokens within the model's context, tokenizing it only where the bounds cannot tell."""
    if must_tokenize(models, request):
        check_tokens(models, request)


def context_of(models) -> int:
    return getattr(models.target.config, "max_position_embeddings", None) or 2**31
