"""Ghost clipping (fedlib.privacy.ghost) gives record-level DP-SGD's clipped sum of the per-sample path.

Tolerances: everything in float64, where the two paths differ only in summation order and in
computing a linear layer's per-sample norm as ``||g|| ||a||`` instead of over the outer product;
both are rounding at ~1e-16 relative per operation, so 1e-10 relative is loose by orders of
magnitude yet far below any real error (a wrong clip factor or a missing layer moves the sum by
1e-3 or more)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedlib import Config, run
from fedlib.models import build_model
from fedlib.privacy.dpsgd import clip_per_sample, per_sample_grads, private_grad
from fedlib.privacy.ghost import _per_sample_conv, ghost_clipped_sum, private_grad_ghost
from fedlib.run import load_model

WEIGHT = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.float64)  # two padding samples


def _setup(name: str, seed: int = 0, proj_dim: int = 16):
    torch.manual_seed(seed)
    model = build_model(name, proj_dim=proj_dim).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = {"x": torch.randn(8, 1, 28, 28, dtype=torch.float64), "y": torch.randint(0, 10, (8,)),
             "w": WEIGHT.clone()}

    def loss(p, b):  # a per-sample loss through the classifier and the projection head, weighted mean
        logits, z = functional_call(model, p, (b["x"],), {"return_repr": True})
        per = F.cross_entropy(logits, b["y"], reduction="none") + 0.1 * z.pow(2).sum(1)
        return (per * b["w"]).sum() / b["w"].sum().clamp_min(1.0)

    return model, params, batch, loss


def _reference(loss, params, batch, clip):
    grads, _ = per_sample_grads(loss, params, batch)
    return clip_per_sample(grads, clip, batch["w"])


def _rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-300)) for k in b)


@pytest.mark.parametrize("name", ["cnn", "mcmahan_cnn", "mlp"])
@pytest.mark.parametrize("clip", [1e-3, 1.0, 1e3])
def test_ghost_sum_and_norms_equal_the_per_sample_path(name, clip):
    """Every model the study trains, clips that bind every sample, some and none; padding included."""
    model, params, batch, loss = _setup(name)
    ref, ref_norms = _reference(loss, params, batch, clip)
    got, norms, value = ghost_clipped_sum(model, loss, params, batch, clip, batch["w"])
    assert _rel(got, ref) < 1e-10
    torch.testing.assert_close(norms, ref_norms, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(value, loss(params, batch), rtol=1e-12, atol=0)
    assert norms[6:].eq(0).all()  # padding


def test_ghost_sum_runs_under_vmap_over_clients():
    """The engine's vectorized path vmaps the step over clients: two clients with their own weights."""
    model, params, batch, loss = _setup("cnn")
    lanes = {k: torch.stack([v, 1.3 * v]) for k, v in params.items()}
    batches = {k: torch.stack([v, v.flip(0)]) for k, v in batch.items()}
    got = vmap(lambda p, b: ghost_clipped_sum(model, loss, p, b, 0.5, b["w"])[0])(lanes, batches)
    ref = vmap(lambda p, b: _reference(loss, p, b, 0.5)[0])(lanes, batches)
    assert _rel(got, ref) < 1e-10


def test_a_sample_with_a_non_finite_gradient_contributes_nothing_and_each_sample_at_most_c():
    """Property (sensitivity): an infinite input makes that sample count as zero, as on the per-sample
    path; removing any one record moves the clipped sum by at most C."""
    model, params, batch, loss = _setup("cnn", seed=3)
    batch["x"][2, 0, 5, 5] = math.inf
    clip = 0.05
    got, norms, _ = ghost_clipped_sum(model, loss, params, batch, clip, batch["w"])
    assert all(torch.isfinite(v).all() for v in got.values())
    assert norms[2] == 0
    ref, _ = _reference(loss, params, batch, clip)
    assert _rel(got, ref) < 1e-10
    for b in range(6):
        w = batch["w"].clone()
        w[b] = 0
        without, _, _ = ghost_clipped_sum(model, loss, params, batch, clip, w)
        change = math.sqrt(sum(float(((got[k] - without[k]) ** 2).sum()) for k in got))
        assert change <= clip * (1 + 1e-12)


STRIDES = [dict(stride=2), dict(padding=2, dilation=2), dict(stride=2, dilation=3, padding=3)]


@pytest.mark.parametrize("kw", STRIDES)
def test_per_sample_convolution_gradients_equal_vmap_of_grad(kw):
    """The grouped-convolution per-sample gradient for strides, dilations and padding."""
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3, **kw).double()
    a = torch.randn(5, 3, 17, 17, dtype=torch.float64)
    w = conv.weight.detach()

    def f(weight, x):
        return (functional_call(conv, {"weight": weight, "bias": conv.bias}, (x,)) ** 2).sum()

    ref = vmap(grad(f), in_dims=(None, 0))(w, a.unsqueeze(1))
    got = _per_sample_conv(conv, a, 2 * conv(a).detach())
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_private_grad_ghost_equals_private_grad_and_refuses_what_it_cannot_do():
    model, params, batch, loss = _setup("cnn", seed=4)
    noise = {k: torch.randn_like(v) for k, v in params.items()}
    ref, ref_loss = private_grad(lambda p, b: loss(p, b), params, {**batch, "noise": noise}, 0.3, 8.0, noise)
    got, got_loss = private_grad_ghost(model, loss, params, {**batch, "noise": noise}, 0.3, 8.0, noise)
    assert _rel(got, ref) < 1e-10
    torch.testing.assert_close(got_loss, ref_loss, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="clip > 0"):
        private_grad_ghost(model, loss, params, batch, 0.0, 8.0, noise)

    normed = nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.LayerNorm(10)).double()
    p = {k: v.detach() for k, v in normed.named_parameters()}
    with pytest.raises(ValueError, match="LayerNorm"):
        ghost_clipped_sum(normed, lambda q, b: functional_call(normed, q, (b["x"],)).sum(), p, batch, 1.0,
                          batch["w"])

    twice = nn.Linear(10, 10).double()
    q = {k: v.detach() for k, v in twice.named_parameters()}
    b10 = {"x": torch.randn(4, 10, dtype=torch.float64), "w": torch.ones(4, dtype=torch.float64)}
    with pytest.raises(RuntimeError, match="called twice"):
        def double(r, b):
            return functional_call(twice, r, (functional_call(twice, r, (b["x"],)),)).sum()

        ghost_clipped_sum(twice, double, q, b10, 1.0, b10["w"])


def test_config_refuses_ghost_without_record_level_dp_or_in_bfloat16():
    base = Config(algorithm="moon_dpap", dp="record", dp_schedule="constant", dp_grad="ghost")
    assert base.validate()
    with pytest.raises(ValueError, match="needs dp = record"):
        base.replace(dp="central").validate()
    with pytest.raises(ValueError, match="needs precision"):
        base.replace(precision="bfloat16").validate()
    with pytest.raises(ValueError, match="dp_grad must be one of per_sample, ghost"):
        base.replace(dp_grad="fast").validate()


@pytest.mark.parametrize(("engine", "conv"), [("vectorized", "grouped"), ("vectorized", "im2col"),
                                             pytest.param("sequential", "grouped", marks=pytest.mark.e2e)])
def test_a_ghost_run_trains_the_model_of_the_per_sample_run(tmp_path, restore_kernels, engine, conv):
    """Two rounds of MOON-DPAP with record-level DP-SGD (float64, the CNN, Poisson batches and noise):
    a ghost-clipped run draws the per-sample run's noise and trains its model (1e-10: the module's
    tolerance, through two rounds of SGD on sums equal to rounding)."""
    cfg = Config(algorithm="moon_dpap", model="cnn", clients=2, train_samples=80, test_samples=20, rounds=2,
                 min_client_samples=10, dp="record", dp_schedule="constant", dp_epsilon_total=8.0,
                 dp_clip=1.0, precision="float64", client_fraction=1.0, batch_size=16)
    ref = run(cfg, engine="sequential", root=tmp_path / "ref", progress=False, device="cpu")
    from fedlib.kernels import set_kernel_options

    set_kernel_options(lane_conv=conv)  # im2col: the ghost hooks see the same layers and sums
    ghost = run(cfg.replace(dp_grad="ghost"), engine=engine, root=tmp_path / "ghost", progress=False,
                device="cpu")
    p_ref, p = load_model(ref, tmp_path / "ref")[1], load_model(ghost, tmp_path / "ghost")[1]
    assert max(float((p[k] - p_ref[k]).abs().max()) for k in p_ref) < 1e-10
    assert ghost.history[-1]["epsilon_spent"] == ref.history[-1]["epsilon_spent"]
    assert ghost.config.key() != ref.config.key() and ghost.config.noise_key() == ref.config.noise_key()


def test_the_shape_cache_forgets_a_freed_model():
    """Regression: the layer-shape cache was keyed on ``id(model)``, which a new model reused after the
    old one was freed (a McMahan CNN got the MOON-DPAP CNN's shapes on CI). It is keyed on the model
    itself, weakly, and on the parameter and batch shapes."""
    import gc

    from fedlib.privacy import ghost

    for name in ("cnn", "mcmahan_cnn", "cnn"):
        model, params, batch, loss = _setup(name)
        ref, _ = _reference(loss, params, batch, 1.0)
        got, _, _ = ghost_clipped_sum(model, loss, params, batch, 1.0, batch["w"])
        assert _rel(got, ref) < 1e-10
        assert model in ghost._SHAPES
        del model, params, batch, loss
        gc.collect()
        assert len(ghost._SHAPES) == 0
