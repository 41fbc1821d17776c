"""Record-level DP-SGD inside a client (Abadi et al., CCS 2016, Alg. 1), as pure tensor code.

One step on a Poisson-sampled batch (see :func:`fedlib.engine.make_poisson_plan`):

``g = (sum_b clip(grad l(w; x_b), C) + N(0, sigma^2 C^2 I)) / B``

with each per-sample gradient clipped to L2 norm ``C`` over *all* parameters together and ``B``
the *expected* batch size (a public constant, as in Opacus; dividing by the realised batch size
would leak it). Adding or removing one record changes the clipped sum by at most ``C``, so each
step is a Poisson-subsampled Gaussian mechanism of multiplier ``sigma`` (add/remove one record).

Per-sample gradients come from ``torch.func`` (``vmap`` of ``grad`` over the batch), so the
function also runs inside the engine's ``vmap`` over clients. The noise is drawn outside (the
engine hands each step its noise, keyed by run, round, client and step,
:class:`fedlib.privacy.noise.StepNoise`), which keeps every engine path on the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import grad_and_value, vmap

Params = dict[str, torch.Tensor]


def per_sample_grads(loss_one: Callable[[Params, dict], torch.Tensor], params: Params,
                     batch: dict[str, torch.Tensor]) -> tuple[Params, torch.Tensor]:
    """``grad l(w; x_b)`` for every sample ``b`` of ``batch`` (leading dimension B) and the
    per-sample losses. ``loss_one(params, one)`` gets a batch of one sample (leading dim 1)."""

    def one(p: Params, sample: dict[str, torch.Tensor]) -> torch.Tensor:
        return loss_one(p, {k: v.unsqueeze(0) for k, v in sample.items()})

    return vmap(grad_and_value(one), in_dims=(None, 0))(params, batch)


def clip_scale(norms: torch.Tensor, clip: float, weight: torch.Tensor) -> torch.Tensor:
    """Each sample's factor in the clipped sum: ``weight_b * min(1, C / ||g_b||)`` (one definition for
    the per-sample path and ghost clipping, :mod:`fedlib.privacy.ghost`)."""
    return weight * torch.where(norms > clip, clip / norms.clamp_min(clip), torch.ones_like(norms))


def clip_per_sample(grads: Params, clip: float, weight: torch.Tensor) -> tuple[Params, torch.Tensor]:
    """``sum_b weight_b * clip(g_b, C)`` (weight 0 drops padding; a per-sample gradient with a NaN
    or infinite coordinate is zeroed first, so the sum's sensitivity stays C) and each sample's norm
    before clipping (over all parameters together: the norm of the per-tensor norms, each computed by
    ``torch.linalg.vector_norm`` in the gradients' dtype, which scales to avoid overflow)."""
    finite = torch.stack([torch.isfinite(g.flatten(1)).all(1) for g in grads.values()], dim=1).all(1)
    grads = {k: torch.where(finite.view(-1, *([1] * (g.dim() - 1))), g, torch.zeros_like(g))
             for k, g in grads.items()}  # a non-finite per-sample gradient counts as zero
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1)
    norms = torch.linalg.vector_norm(per_tensor, dim=1).to(weight.dtype)
    scale = clip_scale(norms, clip, weight)
    return {k: torch.tensordot(scale.to(g.dtype), g, dims=1) for k, g in grads.items()}, norms


def private_grad(loss_one: Callable[[Params, dict], torch.Tensor], params: Params,
                 batch: dict[str, torch.Tensor], clip: float, expected_batch: float,
                 noise: Params) -> tuple[Params, torch.Tensor]:
    """DP-SGD's gradient of one step (the module docstring) and the mean loss of the real
    samples (a diagnostic: it is computed from the private batch without noise). ``noise`` is
    the step's ``N(0, sigma^2 C^2)`` draw; ``batch["w"]`` marks real samples (1) and padding (0)."""
    if not clip > 0 or not expected_batch > 0:
        raise ValueError(f"need clip > 0 and expected_batch > 0, got {clip}, {expected_batch}")
    sample = {k: v for k, v in batch.items() if k != "noise"}
    grads, losses = per_sample_grads(loss_one, params, sample)
    summed, _ = clip_per_sample(grads, clip, batch["w"])
    out = {k: (summed[k] + noise[k]) / expected_batch for k in summed}
    w = batch["w"]
    return out, (losses * w).sum() / w.sum().clamp_min(1.0)
