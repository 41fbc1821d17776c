"""Gradient inversion (DLG / iDLG) and the clip / noise defences."""

import pytest
import torch

from fedlib.attacks.inversion import DLGNet, defend, dlg_attack, infer_label, psnr, target_gradient
from fedlib.data import load
from fedlib.privacy.clipping import flat_norm


@pytest.fixture(scope="module")
def setting():
    ds = load("mnist", train_samples=10, test_samples=10, seed=0)
    x = ds.x_train[:1] * 0.3081 + 0.1307  # pixels back in [0, 1]
    y = ds.y_train[:1]
    torch.manual_seed(0)
    model = DLGNet()
    return model, x, y, target_gradient(model, x, y)


def test_idlg_label_and_undefended_reconstruction(setting):
    model, x, y, g = setting
    assert infer_label(g) == int(y)
    r = dlg_attack(model, g, tuple(x.shape), x, steps=8)
    assert r.psnr > 30, r.psnr  # a recognisable copy of the training image


def test_clipping_alone_does_not_defend(setting):
    model, x, y, g = setting
    clipped = defend(g, clip=0.1)
    assert flat_norm(clipped).item() == pytest.approx(0.1, rel=1e-5)
    r = dlg_attack(model, clipped, tuple(x.shape), x, steps=10, distance="cosine")
    assert r.psnr > 25, r.psnr


def test_noise_defends(setting):
    model, x, y, g = setting
    noisy = defend(g, clip=0.1, noise_multiplier=1.0, seed=1)
    r = dlg_attack(model, noisy, tuple(x.shape), x, steps=10, distance="cosine")
    assert r.psnr < 15, r.psnr


def test_psnr_and_defend_errors():
    a = torch.zeros(4)
    assert psnr(a, a) == float("inf")
    assert psnr(a, torch.full((4,), 0.1)) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        defend({"w": torch.ones(3)}, noise_multiplier=1.0)
