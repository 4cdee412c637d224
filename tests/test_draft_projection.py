"""The drafters' projection onto a draft vocabulary (specviz.drafters.base.vocab_projection): on the default weights
the target's 8-bit head rows on 8-bit activations, each logit with the bits of the whole head's; elsewhere the rows
packed in the draft's dtype; built once per (head, rows) and reused."""
import gc

import pytest
import torch
from test_q4 import tiny_pair
from test_q8act import needs_op, q4q8_pair

from specviz.drafters.base import PROJECTION_ENV, vocab_projection
from specviz.errors import SpecvizError
from specviz.kernels import fastlinear, quant
from specviz.kernels.fastlinear import rows_projection

pytestmark = needs_op


@pytest.fixture(scope="module")
def q8_target():
    return q4q8_pair()[1]


def some_rows(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:n]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9])
def test_the_heads_rows_give_the_bits_of_those_columns_of_the_whole_head(q8_target, rows):
    head = quant.q8_head(q8_target)
    vocab = some_rows(32, head.linear.out_features)
    x = torch.randn(rows, q8_target.config.hidden_size, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        assert torch.equal(head.rows(vocab)(x), head(x)[:, vocab])
        rounded = x.bfloat16()  # what a head in bf16 hands over
        assert torch.equal(vocab_projection(q8_target, vocab, torch.bfloat16)(rounded), head(rounded.float())[:, vocab])
        assert torch.equal(vocab_projection(q8_target, None, torch.bfloat16)(x), head(x))  # the whole head


def test_rows_that_are_not_whole_tiles_or_a_head_on_fp32_activations_take_the_packed_rows(q8_target):
    q4 = tiny_pair()[1]  # its 8-bit head takes fp32 activations
    assert not quant.q8_head(q4).on_8_bit_activations()
    odd = some_rows(24, q8_target.config.vocab_size)
    assert not quant.q8_head(q8_target).on_8_bit_activations(odd)
    x = torch.randn(3, q8_target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for model, vocab in ((q8_target, odd), (q4, some_rows(32, q4.config.vocab_size))):
        expected = x @ model.get_output_embeddings().weight[vocab].T
        with torch.inference_mode():
            got = vocab_projection(model, vocab, torch.bfloat16)(x)
        assert got.dtype == torch.bfloat16  # packed rows in the draft's dtype
        assert torch.allclose(got.float(), expected, rtol=3e-2, atol=3e-2 * expected.abs().max().item())


def test_the_rows_are_cut_once_and_reused(q8_target, monkeypatch):
    fastlinear._projections.clear()
    cuts = []
    original = quant.Q8Head.rows
    monkeypatch.setattr(quant.Q8Head, "rows", lambda self, rows: cuts.append(len(rows)) or original(self, rows))
    vocab = some_rows(48, q8_target.config.vocab_size, seed=5)
    x = torch.randn(2, q8_target.config.hidden_size)
    with torch.inference_mode():
        first = vocab_projection(q8_target, vocab, torch.float32)(x)
        again = vocab_projection(q8_target, vocab.clone(), torch.float32)(x)
    assert cuts == [48] and torch.equal(first, again)


def test_each_head_keeps_its_own_rows_and_they_go_with_it():
    fastlinear._projections.clear()
    one, two = q4q8_pair(scale=1.0)[1], q4q8_pair(scale=3.0)[1]  # other weights, the same rows
    vocab = some_rows(32, one.config.vocab_size, seed=3)
    x = torch.randn(2, one.config.hidden_size)
    with torch.inference_mode():
        got = [vocab_projection(model, vocab, torch.float32)(x) for model in (one, two)]
        assert all(torch.equal(g, quant.q8_head(m)(x)[:, vocab]) for g, m in zip(got, (one, two)))
    assert not torch.equal(got[0], got[1]) and len(fastlinear._projections) == 2
    del one, got
    gc.collect()
    assert len(fastlinear._projections) == 1  # the first model's rows went with it


def test_the_switch_keeps_the_packed_rows_and_refuses_other_values(q8_target, monkeypatch):
    vocab = some_rows(32, q8_target.config.vocab_size, seed=2)
    x = torch.randn(2, q8_target.config.hidden_size).bfloat16()
    packed = rows_projection(q8_target.get_output_embeddings().weight, vocab, torch.bfloat16)
    monkeypatch.setenv(PROJECTION_ENV, "packed")
    with torch.inference_mode():
        assert torch.equal(vocab_projection(q8_target, vocab, torch.bfloat16)(x), packed(x))
    monkeypatch.setenv(PROJECTION_ENV, "auto")
    with torch.inference_mode():
        assert torch.equal(vocab_projection(q8_target, vocab, torch.bfloat16)(x),
                           quant.q8_head(q8_target)(x.float())[:, vocab])
    monkeypatch.setenv(PROJECTION_ENV, "Packed")
    with pytest.raises(SpecvizError, match="SPECVIZ_DRAFT_PROJECTION must be auto or packed"):
        vocab_projection(q8_target, vocab, torch.bfloat16)
