"""What a client of `specviz serve` cannot do to it: pin memory, read or cancel another client's runs, get a 5xx
or an unbounded echo from any input, or reach the API through a name it does not answer to."""
from __future__ import annotations

import pytest
import torch
from serving import Running, post

from specviz.kernels import fastlinear
from specviz.models.heads import EagleHead
from specviz.models.loading import LoadedModels
from specviz.serve.http import Service

from tiny import TinyTokenizer, tiny_llama


@pytest.fixture(scope="module")
def headed():
    """A tiny target with a random EAGLE head whose trained draft vocabulary is in frequency order."""
    target = tiny_llama(vocab_size=64, scale=3.0)
    torch.manual_seed(0)
    eagle = EagleHead(target.config).eval()
    for p in eagle.parameters():
        p.data.normal_(0, 0.3)
    eagle.draft_vocab = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    return LoadedModels("tiny-eagle", target, None, TinyTokenizer(64), target.device, target.dtype, eagle=eagle)


def test_a_client_cannot_pin_memory_with_a_drafter_option(headed):
    """Each distinct draft_vocab once built a packed LM-head copy kept for the life of the process."""
    with Running(Service({"tiny": headed}, max_queue=64, max_per_client=64)) as running:
        before = len(fastlinear._projections)
        for n in range(5, 25):
            for body in ({"drafter": "eagle2", "drafter_options": {"draft_vocab": n}}, {"drafter": f"eagle2:draft_vocab={n}"}):
                response = post(running.url, {"prompt": "abc", "chat": False, "max_new_tokens": 2, **body})
                assert response.status_code == 400 and "not offered" in response.json()["error"]["message"]
        assert len(fastlinear._projections) <= before + 1


def test_the_row_projection_cache_is_bounded():
    weight = torch.randn(64, 8)
    held = [fastlinear.rows_projection(weight, torch.arange(n)) for n in range(1, 41)]  # drafters holding them
    assert sum(key[0] == id(weight) for key in fastlinear._projections) <= fastlinear.MAX_PROJECTIONS
    assert fastlinear.rows_projection(weight, torch.arange(40)) is held[-1]  # the most recent are reused
