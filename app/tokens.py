"""Token text as a reader should see it. A byte-level tokenizer splits many characters over several tokens, and
decoding one such token alone gives U+FFFD (�). Decoding the tokens' bytes together joins what belongs together;
a byte that still ends inside a character shows as its hexadecimal value, ‹e6 97›. No streamlit here."""
from __future__ import annotations

import codecs
import re
from functools import lru_cache
from typing import Any

REPLACEMENT = "\ufffd"
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback pieces
MARKER = "specviz-byte-marker"


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted (character of a token piece → the byte it stands for): printable
    Latin-1 bytes stand for themselves, the other bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The bytes one token stands for: from its byte-level piece (GPT-2 style, SmolLM2's and Qwen's tokenizers) or
    its SentencePiece byte piece; any other piece is its own decoded text."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    piece = convert(token) if convert else None
    if isinstance(piece, str) and piece:
        byte = BYTE_PIECE.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        alphabet = byte_alphabet()
        if all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
    return str(tokenizer.decode([token])).encode()


def _marker(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    cut = error.object[error.start:error.end]
    return "‹" + " ".join(f"{b:02x}" for b in cut) + "›", error.end


codecs.register_error(MARKER, _marker)


def readable(tokens: tuple[int, ...] | list[int], texts: dict[int, str], tokenizer: Any = None) -> str:
    """The text of a few tokens together. `texts` are the tokens' own texts (from a run's events); where one of
    them is cut inside a character and the tokenizer is at hand, the tokens' bytes are decoded together, each byte
    left over shown as ‹hex›; without a tokenizer such a token shows as ‹part of a character, id N›."""
    parts = [texts.get(t) for t in tokens]
    if all(p is not None and REPLACEMENT not in p for p in parts):
        return "".join(p for p in parts if p is not None)
    if tokenizer is not None:
        return b"".join(token_bytes(tokenizer, t) for t in tokens).decode("utf-8", MARKER)
    return "".join(f"‹token {t}›" if p is None else p.replace(REPLACEMENT, f"‹part of a character, id {t}›")
                   for t, p in zip(tokens, parts))
