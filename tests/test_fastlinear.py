"""The packed-weight linear layers: same products as F.linear (to rounding), swapped in place, switchable off."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from specviz.kernels import fastlinear

pytestmark = pytest.mark.skipif(not fastlinear.supported(), reason="this torch build lacks oneDNN's packed linear")


def test_packed_linear_matches_f_linear_for_every_row_count():
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    linear = nn.Linear(96, 200)
    packed = fastlinear.PackedLinear(linear)
    for rows in (1, 2, 3, 8, 33):
        x = torch.randn(1, rows, 96, generator=generator)
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features, in_features", [(300, 96), (3072, 576), (576, 1536), (8192, 576)])
def test_rows_padded_to_min_rows_come_out_as_unpadded_to_rounding(monkeypatch, dtype, out_features, in_features):
    """(3072, 576), (576, 1536): SmolLM2-135M's fused gate-up and its down projection; (8192, 576): an LM head."""
    if not fastlinear.supported(dtype):
        pytest.skip(f"no packed {dtype} kernel here")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    bias = torch.randn(out_features, generator=generator).to(dtype)
    packed = fastlinear.reorder(weight)
    x = torch.randn(1, 2, in_features, generator=generator).to(dtype)  # (batch, rows, in): transformers' layout
    with torch.inference_mode():
        monkeypatch.setattr(fastlinear, "MIN_ROWS", 1)
        plain = [fastlinear.packed_product(x[:, :n], packed, bias) for n in (1, 2)]
        monkeypatch.setattr(fastlinear, "MIN_ROWS", 4)
        padded = [fastlinear.packed_product(x[:, :n], packed, bias) for n in (1, 2)]
    for a, b, n in zip(plain, padded, (1, 2)):
        assert b.shape == (1, n, out_features)
        # bit for bit for most shapes; oneDNN may split a long row (the 1536-wide down projection) differently
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * a.abs().max().item())


def test_pack_linears_swaps_in_place_and_keeps_ties_and_outputs(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.inference_mode():
        before = model(ids).logits
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    assert fastlinear.pack_linears(model) == n_linear > 0
    assert fastlinear.is_packed(model) and not any(type(m) is nn.Linear for m in model.modules())
    if model.config.tie_word_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    with torch.inference_mode():
        after = model(ids).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    assert torch.equal(after.argmax(-1), before.argmax(-1))


def test_switched_off_by_environment_and_skipped_off_cpu_fp32(monkeypatch):
    linear = nn.Linear(8, 8)
    monkeypatch.setenv(fastlinear.ENV_SWITCH, "0")
    assert fastlinear.pack_linears(nn.Sequential(linear)) == 0
    monkeypatch.delenv(fastlinear.ENV_SWITCH)
    assert fastlinear.pack_linears(nn.Sequential(nn.Linear(8, 8).to(torch.float64))) == 0
    assert fastlinear.pack_linears(nn.Sequential(linear)) == 1


def test_projection_matches_plain_product():
    weight = torch.randn(300, 64)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        torch.testing.assert_close(fastlinear.PackedProjection(weight)(x), x @ weight.T, rtol=1e-5, atol=1e-5)


def test_packed_linear_survives_casts_moves_copies_and_weight_loads():
    import copy

    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    packed = fastlinear.PackedLinear(linear)
    x = torch.randn(3, 16)
    copied = copy.deepcopy(packed)
    assert copied.packed is not None and copied.weight is not packed.weight
    torch.testing.assert_close(copied(x), packed(x))
    fresh = nn.Linear(16, 24)
    packed.load_state_dict(fresh.state_dict())  # the packed copy must follow new weights
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), fresh(x), rtol=1e-5, atol=1e-5)
    packed.double()  # not packable: falls back to the plain product, in float64
    assert packed.packed is None
    torch.testing.assert_close(packed(x.double()), fresh.double()(x.double()))
    packed.float()
    assert packed.packed is not None


def test_gradients_reach_a_trainable_weight():
    linear = nn.Linear(8, 4)
    packed = fastlinear.PackedLinear(linear)
    packed(torch.randn(2, 8)).sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0


def test_row_projections_are_made_once_per_weight_and_rows():
    weight, other = torch.randn(50, 8), torch.randn(50, 8)
    rows = torch.tensor([4, 1, 9])
    first = fastlinear.rows_projection(weight, rows)
    assert fastlinear.rows_projection(weight, torch.tensor([4, 1, 9])) is first
    assert fastlinear.rows_projection(weight, None) is not first
    assert fastlinear.rows_projection(other, rows) is not first
    x = torch.randn(2, 8)
    with torch.inference_mode():
        torch.testing.assert_close(first(x), x @ weight[rows].T, rtol=1e-5, atol=1e-5)


def test_bf16_weights_pack_only_on_cpus_with_native_bf16(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 96, generator=generator).bfloat16()
    x = torch.randn(5, 96, generator=generator).bfloat16()
    monkeypatch.setattr(fastlinear, "native_bf16", lambda: False)
    assert not fastlinear.usable(weight) and fastlinear.PackedProjection(weight).packed is None
    assert fastlinear.usable(weight.float())
    if not fastlinear.supported(torch.bfloat16):
        pytest.skip("this torch build has no packed bf16 kernel")
    monkeypatch.setattr(fastlinear, "native_bf16", lambda: True)
    projection = fastlinear.PackedProjection(weight)
    assert projection.packed is not None
    with torch.inference_mode():
        got = projection(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, weight).float(), rtol=2e-2, atol=2e-2)


def test_rows_projection_is_made_once_per_weight_rows_and_dtype():
    weight = torch.randn(64, 16)
    rows = torch.tensor([5, 1, 9])
    assert fastlinear.rows_projection(weight, rows) is fastlinear.rows_projection(weight, rows)
    half = fastlinear.rows_projection(weight, rows, torch.bfloat16)
    assert half is not fastlinear.rows_projection(weight, rows) and half is fastlinear.rows_projection(weight, rows, torch.bfloat16)
    x = torch.randn(2, 16)
    with torch.inference_mode():
        torch.testing.assert_close(half(x.bfloat16()).float(), x @ weight[rows].T, rtol=3e-2, atol=3e-2)
