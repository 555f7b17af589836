"""dsahal.model.packed: projections of one input as one matmul, the weights packed in place once."""
import torch
from torch import nn

from dsahal.model.packed import adjacent_stack, pack_rows, packed_weight, project


def linears(*outs, dtype=torch.float32):
    torch.manual_seed(0)
    return [nn.Linear(16, n, bias=False).to(dtype) for n in outs]


def test_packing_keeps_parameters_and_values_and_shares_one_storage():
    layers = linears(8, 8, 3)
    params = [layer.weight for layer in layers]
    before = [p.detach().clone() for p in params]
    x = torch.randn(5, 16)
    want = [layer(x) for layer in layers]
    with torch.no_grad():
        got = project(x, layers)
    assert all(layer.weight is p for layer, p in zip(layers, params))  # the same Parameter objects
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    view = packed_weight(layers)
    assert view.shape == (19, 16) and view.data_ptr() == params[0].data_ptr()
    with torch.no_grad():  # an in-place load writes through to the packed buffer
        params[1].copy_(torch.ones(8, 16))
    assert torch.equal(packed_weight(layers)[8:16], torch.ones(8, 16))


def test_new_storage_is_packed_again_and_grad_or_bias_keeps_the_separate_matmuls():
    layers = linears(4, 4)
    x = torch.randn(3, 16)
    with torch.no_grad():
        project(x, layers)
        layers[0].weight.data = layers[0].weight.data.clone()  # what .to() / to_empty do to one parameter
        assert packed_weight(layers) is not None  # packed again
    assert layers[0].weight.untyped_storage().data_ptr() == layers[1].weight.untyped_storage().data_ptr()
    fresh = linears(4, 4)
    out = project(x, fresh)  # grad enabled: separate, and gradients reach the parameters
    sum(o.sum() for o in out).backward()
    assert all(layer.weight.grad is not None for layer in fresh)
    assert fresh[0].weight.untyped_storage().data_ptr() != fresh[1].weight.untyped_storage().data_ptr()
    biased = [nn.Linear(16, 4), nn.Linear(16, 4)]
    with torch.no_grad():
        assert packed_weight(biased) is None
        torch.testing.assert_close(project(x, biased)[1], biased[1](x))


def test_adjacent_stack_is_a_view_of_packed_outputs_and_a_copy_otherwise():
    layers = linears(6, 6, 6, 2)
    x = torch.randn(4, 16)
    with torch.no_grad():
        q, k, v, _ = project(x, layers)
    stacked = adjacent_stack((q, k, v))
    assert stacked.data_ptr() == q.data_ptr() and torch.equal(stacked, torch.stack([q, k, v], dim=1))
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    assert torch.equal(adjacent_stack((a, b)), torch.stack([a, b], dim=1))



def test_inference_mode_uses_the_separate_matmuls_until_packed_under_no_grad():
    layers = linears(4, 4)
    x = torch.randn(2, 16)
    with torch.inference_mode():
        assert packed_weight(layers) is None
        torch.testing.assert_close(project(x, layers)[0], layers[0](x))
    with torch.no_grad():
        assert packed_weight(layers) is not None
    with torch.inference_mode():  # packed before: the view serves
        assert packed_weight(layers) is not None


def test_a_memo_skips_the_checks_only_while_every_address_is_unchanged():
    layers = linears(4, 4, 4)
    weights = [layer.weight for layer in layers]
    memo = {}
    with torch.no_grad():
        first = pack_rows(weights, memo)
        assert memo["rows"] == 12 and torch.equal(pack_rows(weights, memo), first)
        weights[1].data = weights[1].data.clone()  # one weight moved: checked and packed again
        again = pack_rows(weights, memo)
    assert torch.equal(again, first) and memo["addresses"][1] == weights[1].data_ptr()
    assert weights[1].data_ptr() == weights[0].data_ptr() + 4 * 16 * 4
