import pytest
import torch
import torch.nn.functional as F

from fedlib.models import (
    LaneConv2d,
    McMahanCNN,
    MoonDpapCNN,
    build_model,
    conv2d_im2col,
    count_parameters,
    max_pool2,
    relu_max_pool2,
)


def test_shapes_and_repr():
    x = torch.randn(5, 1, 28, 28)
    for name, dim in (("cnn", 128), ("mcmahan_cnn", 512), ("mlp", 100)):
        m = build_model(name)
        assert m(x).shape == (5, 10)
        logits, rep = m(x, return_repr=True)
        assert logits.shape == (5, 10) and rep.shape == (5, dim)


def test_parameter_counts():
    assert count_parameters(McMahanCNN()) == 1_663_370  # as stated by McMahan et al. 2017
    assert count_parameters(MoonDpapCNN()) == 424_266
    assert count_parameters(build_model("mlp")) == 784 * 100 + 100 + 100 * 10 + 10


def test_explicit_dropout_mask():
    torch.manual_seed(0)
    m = build_model("cnn", dropout=0.5)
    x = torch.randn(4, 1, 28, 28)
    ones = torch.ones(4, 128)
    zeros = torch.zeros(4, 128)
    assert torch.allclose(m(x, dropout_mask=ones), m.fc2(2 * m(x, return_repr=True)[1]))
    assert torch.allclose(m(x, dropout_mask=zeros), m.fc2.bias.expand(4, 10))


@pytest.mark.parametrize("padding", [0, 2])
def test_im2col_convolution_equals_pytorchs_alone_and_under_vmap_over_lanes(padding):
    """The two lane_conv choices compute the same convolution: in float64 within 1e-12 (summation
    order only; the products are exact), for one model and for six lanes with a weight each."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((6, 5, 3, 12, 12), (6, 4, 3, 5, 5),
                                                                          (6, 4)))
    pad = (padding, padding)
    ref = torch.stack([F.conv2d(x[i], w[i], b[i], padding=pad) for i in range(6)])
    assert (conv2d_im2col(x[0], w[0], b[0], pad) - ref[0]).abs().max() < 1e-12
    lanes = torch.vmap(lambda xi, wi, bi: conv2d_im2col(xi, wi, bi, pad))(x, w, b)
    assert lanes.shape == ref.shape and (lanes - ref).abs().max() < 1e-12
    no_bias = conv2d_im2col(x[0], w[0], None, pad) - F.conv2d(x[0], w[0], None, padding=pad)
    assert no_bias.abs().max() < 1e-12


def test_lane_conv_switches_the_models_convolutions_and_keeps_their_parameters(restore_kernels):
    from fedlib.kernels import set_kernel_options

    torch.manual_seed(3)
    a = build_model("mcmahan_cnn").double()
    torch.manual_seed(3)
    plain = torch.nn.Conv2d(1, 32, 5, padding=2)
    assert isinstance(a.conv1, torch.nn.Conv2d) and torch.equal(a.conv1.weight.float(), plain.weight)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    grouped = a(x)
    set_kernel_options(lane_conv="im2col")
    assert (a(x) - grouped).abs().max() < 1e-12
    with pytest.raises(ValueError, match="lane_conv"):
        set_kernel_options(lane_conv="winograd")
    with pytest.raises(ValueError, match="stride 1"):
        LaneConv2d(1, 2, 3, stride=2)


def _tie_heavy(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Activations with many exact ties, as FashionMNIST's blank background gives a conv layer:
    whole windows of one positive value (the bias), of zero and of one negative value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64).round()
    x[..., :4, :] = 0.5
    x[..., 4:6, :] = 0.0
    x[..., 6:8, :] = -1.0
    return x


@pytest.mark.parametrize("shape", [(3, 4, 10, 12), (2, 3, 9, 7)])
def test_max_pool2_equals_pytorchs_max_pool_bit_for_bit(shape):
    """The CPU channels-last pooling gives F.max_pool2d's values and gradients exactly, ties and
    odd sizes included, through a double backward (what a gradient-inversion attack takes) and
    under vmap over lanes with torch.func.grad (the vectorized engine)."""
    from torch.func import grad, vmap

    x = _tie_heavy(shape, 0)
    upstream = torch.randn(F.max_pool2d(x, 2).shape, generator=torch.Generator().manual_seed(1),
                           dtype=torch.float64)
    weights = torch.arange(x.numel(), dtype=x.dtype).view_as(x)
    results = []
    for pool in (max_pool2, lambda h: F.max_pool2d(h, 2)):
        h, up = x.clone().requires_grad_(True), upstream.clone().requires_grad_(True)
        out = pool(h)
        (g,) = torch.autograd.grad(out, h, up, create_graph=True)
        (gg,) = torch.autograd.grad((g * weights).sum(), up)
        results.append((out.detach(), g.detach(), gg))
    for ours, pytorchs in zip(*results, strict=True):
        assert torch.equal(ours, pytorchs)
    lanes = torch.stack([_tie_heavy(shape, s) for s in range(3)])
    per_lane = vmap(grad(lambda h: (max_pool2(h) * upstream).sum()))(lanes)
    reference = vmap(grad(lambda h: (F.max_pool2d(h, 2) * upstream).sum()))(lanes)
    assert torch.equal(per_lane, reference)


def test_relu_max_pool2_equals_max_pool_of_relu_bit_for_bit():
    """Pooling before ReLU gives the same values and gradients as ReLU before pooling."""

    x = _tie_heavy((3, 4, 10, 12), 2)
    upstream = torch.randn(3, 4, 5, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    outs = []
    for f in (relu_max_pool2, lambda h: F.max_pool2d(F.relu(h), 2)):
        h = x.clone().requires_grad_(True)
        out = f(h)
        outs.append((out.detach(), torch.autograd.grad(out, h, upstream)[0]))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("name", ["cnn", "mcmahan_cnn"])
def test_models_train_bit_for_bit_as_with_pytorchs_pooling(name, monkeypatch):
    """A training gradient of each CNN (float32, blank-background images) is the same bits as
    with ReLU then F.max_pool2d: the reorder and the channels-last pooling change no result."""
    import fedlib.models as models

    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 1, 28, 28, generator=g) * (torch.rand(16, 1, 28, 28, generator=g) > 0.6)
    y = torch.randint(0, 10, (16,), generator=g)
    grads = []
    for pooling in ("fedlib", "pytorch"):
        if pooling == "pytorch":
            monkeypatch.setattr(models, "relu_max_pool2", lambda h: F.max_pool2d(F.relu(h), 2))
        torch.manual_seed(0)
        m = build_model(name)
        grads.append(torch.autograd.grad(F.cross_entropy(m(x), y), list(m.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
