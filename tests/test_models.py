import torch

from fedlib.models import McMahanCNN, MoonDpapCNN, build_model, count_parameters


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
