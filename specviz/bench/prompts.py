"""The bench's prompts: the built-in set, or a JSONL file of MT-bench-style rows."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specviz.errors import SpecvizError

PROMPTS_FILE = Path(__file__).parent / "data" / "prompts.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def load_prompts(path: str | os.PathLike | None = None, limit: int | None = None) -> list[Prompt]:
    """JSONL rows with `turns` (the first turn is used) or `instruction`; the built-in set when path is None."""
    path = Path(path) if path else PROMPTS_FILE
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # JSONL: not splitlines(), which also splits inside strings at U+2028 and the like
    except OSError as err:
        raise SpecvizError(f"cannot read the prompts file {path}: {err}") from err
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecvizError(f"{path}:{number} is not JSON: {err}") from err
        turns = row.get("turns") if isinstance(row, dict) else None
        text = turns[0] if isinstance(turns, list) and turns else row.get("instruction") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise SpecvizError(f"{path}:{number} needs a non-empty 'turns' list or an 'instruction'")
        prompts.append(Prompt(str(row.get("id", row.get("question_id", number))), text))
    if limit is not None:
        if limit < 1:
            raise SpecvizError(f"--limit must be >= 1, got {limit}")
        prompts = prompts[:limit]
    if not prompts:
        raise SpecvizError(f"no prompts to run from {path}")
    check_unique_ids(prompts)
    return prompts


def check_unique_ids(prompts: list[Prompt]) -> None:
    """Results are grouped by prompt id, so two prompts may not share one."""
    seen = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise SpecvizError(f"two prompts have the id {prompt.id!r}; give each row its own `id`")
        seen.add(prompt.id)
