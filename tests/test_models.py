import pytest
import torch
import torch.nn.functional as F

from fedlib.models import LaneConv2d, McMahanCNN, MoonDpapCNN, build_model, conv2d_im2col, count_parameters


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
