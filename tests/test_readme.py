"""The README's drafter table and layout map say what the code has: the table is `specviz drafters --table` of the
registry, and the layout map names every package of specviz and only paths that exist."""
from __future__ import annotations

import re
from pathlib import Path

from specviz.drafters import REGISTRY
from specviz.drafters.spec import to_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def drafter_table(text: str) -> str:
    """The README's drafter table: from its header line to the first blank line."""
    start = text.index("| drafter | what it does | needs | options |")
    return text[start:].split("\n\n", 1)[0].strip()


def layout_map(text: str) -> list[str]:
    """The paths the layout map names: the first column of its code block (`app.py, app/` names two)."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return [path for line in block.splitlines() if line and not line[0].isspace()
            for path in re.split(r",\s*", re.split(r"\s{2,}", line.strip())[0])]


def packages() -> set[str]:
    """specviz's packages and its folder of shipped weights (assets/, package data through the link specviz/assets),
    as the map writes them: `specviz/cli/`."""
    folders = {p.parent for p in (ROOT / "specviz").glob("*/__init__.py")} | {ROOT / "assets"}
    return {f"{folder.relative_to(ROOT)}/" for folder in folders}


def test_the_drafter_table_is_what_the_registry_says():
    assert "repeat" not in REGISTRY  # the toy drafter of test_toy_drafter is not left registered
    assert drafter_table(README) == to_table(REGISTRY.values()), \
        "README's drafter table is stale: paste `specviz drafters --table` over it"


def test_the_drafter_table_check_catches_a_missing_option():
    stale = README.replace(", `epsilon`, `delta`, `tree`", "")
    assert drafter_table(stale) != to_table(REGISTRY.values())


def test_the_layout_map_names_every_package_and_only_what_exists():
    named = layout_map(README)
    assert "specviz/decoding/" in named and "app.py" in named  # the map was read
    missing = sorted(packages() - set(named))
    assert not missing, f"the README's layout map has no line for {missing}"
    gone = sorted(path for path in named if not (ROOT / path).exists())
    assert not gone, f"the README's layout map names paths that do not exist: {gone}"


def test_the_layout_map_check_sees_a_package_it_lacks():
    without = "\n".join(line for line in README.splitlines() if not line.startswith("specviz/serve/"))
    assert "specviz/serve/" in packages() - set(layout_map(without))


def test_the_readme_is_a_guide_of_at_most_250_lines_with_the_commands_first():
    """What it is, then the two commands before any detail; the rest lives in docs/."""
    assert len(README.splitlines()) <= 250
    assert README.index("make run") < README.index("## The app") < README.index("## Results")
    assert README.index("## Quick start") < README.index("## Two regimes on one machine")
