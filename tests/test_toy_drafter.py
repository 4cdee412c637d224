"""Adding a drafter is its file, its line in the registry and its tests: a toy drafter declared the way
CONTRIBUTING.md says, registered, then run through the Python API, the CLI, the service (with an option, bounded
by its spec) and the app, with no other file touched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from streamlit.testing.v1 import AppTest

import specviz
from app import teaching
from app.state import ENV_MODEL
from specviz import drafters
from specviz.cli import main as cli
from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.tree import ROOT, DraftTree
from specviz.drafters import REGISTRY, DrafterSpec, Option
from specviz.drafters.spec import to_markdown
from specviz.serve.http import Service

ROOT_DIR = Path(__file__).resolve().parents[1]


class RepeatDrafter(Drafter):
    """Proposes the last token again, `repeat` times: a point-mass chain (no q), so verification is exact."""

    name = "repeat"

    def __init__(self, repeat: int = 2):
        self.repeat = repeat

    def propose(self, request: DraftRequest) -> DraftTree:
        tree, parent = DraftTree(), ROOT
        last = int(request.ids[-1])
        for _ in range(min(self.repeat, request.max_depth)):
            parent = tree.add(last, parent)
        return tree

    def options(self) -> dict:
        return {"repeat": self.repeat}


def build(models, k: int, options: dict) -> RepeatDrafter:
    return RepeatDrafter(**options)


SPEC = DrafterSpec("repeat", "proposes the last token again (a toy)", build,
                   options=(Option("repeat", int, 2, "how many copies to propose", low=1, high=4),))


@pytest.fixture
def toy():
    drafters.register(SPEC)
    yield SPEC
    drafters.unregister(SPEC.name)


def test_the_registry_refuses_a_second_drafter_of_the_same_name(toy):
    with pytest.raises(specviz.SpecvizError, match="already registered"):
        drafters.register(SPEC)


def test_the_api_runs_it_and_greedy_output_equals_none(toy, tiny_models):
    runs = {d: specviz.generate("Say hello.", models=tiny_models, drafter=d, max_new_tokens=12)
            for d in ("none", "repeat:repeat=3")}
    assert runs["repeat:repeat=3"].token_ids == runs["none"].token_ids
    assert runs["repeat:repeat=3"].stats["drafted"] > 0
    with pytest.raises(specviz.SpecvizError, match="unknown repeat options: depth"):
        specviz.generate("Say hello.", models=tiny_models, drafter="repeat:depth=2", max_new_tokens=4)


def test_the_cli_runs_it_with_an_option(toy, tiny_model_dir, capsys):
    code = cli.main(["generate", "--model", str(tiny_model_dir), "--device", "cpu", "--prompt", "Say hello.",
                     "--drafter", "repeat:repeat=1", "--max-new-tokens", "6", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["stats"]["new_tokens"] == 6
    assert cli.main(["generate", "--model", str(tiny_model_dir), "--prompt", "x", "--drafter", "repeat:repeat=yes"]) == 2
    assert cli.main(["drafters"]) == 0
    assert "repeat: proposes the last token again" in capsys.readouterr().out


def test_the_service_takes_its_option_within_the_spec_bounds(toy, tiny_models):
    service = Service({"tiny": tiny_models})
    assert "repeat" in service.describe()[0]["drafters"]
    with TestClient(service.app()) as client:
        made = client.post("/v1/runs", json={"prompt": "Say hello.", "drafter": "repeat",
                                             "drafter_options": {"repeat": 3}, "max_new_tokens": 6})
        assert made.status_code == 201, made.text
        lines = client.get(f"/v1/runs/{made.json()['run_id']}/events.jsonl").text.splitlines()
        start, done = json.loads(lines[0]), json.loads(lines[-1])
        assert start["drafter"] == "repeat" and start["options"] == {"repeat": 3}
        assert done["type"] == "done" and len(done["token_ids"]) == 6
        too_many = client.post("/v1/runs", json={"prompt": "Say hello.", "drafter": "repeat:repeat=5"})
        assert too_many.status_code == 400
        assert "repeat option repeat must be a whole number from 1 to 4" in too_many.json()["error"]["message"]


def test_the_app_offers_it_with_its_help(toy, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = AppTest.from_file(str(ROOT_DIR / "app.py"), default_timeout=120)
    at.run()
    drafter = at.sidebar.selectbox(key="sb_drafter")
    assert "repeat" in drafter.options
    drafter.set_value("repeat")
    at.run()
    assert "proposes the last token again (a toy)" in [c.value for c in at.sidebar.caption]
    at.switch_page("app/pages/live.py")
    at.run()
    at.sidebar.slider(key="sb_max_new").set_value(6)
    at.run()
    at.button(key="live_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.exception or at.error]
    assert "".join(h.proto.body for h in at.html).count('class="specviz-token"') == 6


def test_the_topologies_page_gives_it_a_card_from_its_spec(toy):
    card = next(t for t in teaching.cards() if t.drafter == "repeat")
    assert card.reads == SPEC.help and not card.published


def test_docs_drafters_md_is_what_the_registry_says():
    assert "repeat" not in REGISTRY
    written = (ROOT_DIR / "docs" / "drafters.md").read_text()
    assert written.strip() == to_markdown(REGISTRY.values()).strip(), \
        "docs/drafters.md is stale: run `specviz drafters --markdown > docs/drafters.md`"


def test_a_point_mass_chain_verifies_exactly_at_temperature_one(toy, tiny_models):
    """The toy's tokens are point masses: every test event has q None and α = p(x)."""
    events = list(specviz.stream("Say hello.", models=tiny_models, drafter="repeat", max_new_tokens=8,
                                 temperature=1.0, seed=1))
    tests = [t for e in events if e.type == "step" for t in e.tests]
    assert tests and all(t.q is None and t.alpha == pytest.approx(t.p) for t in tests)
