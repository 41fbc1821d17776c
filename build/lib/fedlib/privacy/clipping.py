"""L2 clipping of a whole update (all tensors flattened into one vector).

``clip_by_l2(u, C) = u * min(1, C / ||u||_2)`` (McMahan et al., ICLR 2018, Alg. 1): the
sensitivity of a sum of clipped updates to adding or removing one client is ``C``. An update with a
NaN or infinite coordinate is replaced by zeros first (:func:`zero_if_not_finite`), so the bound
holds for any input.
Pure tensor code (no branching on values), so it runs inside ``vmap``.
"""

from __future__ import annotations

import torch

from fedlib.tree import Tree, leaves, tmap


def flat_norm(tree: Tree) -> torch.Tensor:
    """L2 norm of all leaves of ``tree`` taken together (summed in float64, returned in the
    leaves' dtype; a norm beyond that dtype's range is inf there)."""
    xs = leaves(tree)
    return _norm64(xs).to(xs[0].dtype)


def _norm64(xs: list[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum((x.double() ** 2).sum() for x in xs))


def zero_if_not_finite(tree: Tree) -> tuple[Tree, torch.Tensor]:
    """``tree`` unchanged when every coordinate is finite, else all zeros; and whether it was finite.

    A diverged or malicious client's NaN or infinite update would pass any clip unchanged (``norm >
    C`` is false for NaN) and break the bound that the noise is calibrated for (rounded to a grid, a
    NaN becomes about -2^63 steps). Replaced by zeros, it is one valid input among others, so the
    release stays bounded and the guarantee holds whatever a client sends. Pure tensor code (runs
    under ``vmap``)."""
    ok = torch.stack([torch.isfinite(x).all() for x in leaves(tree)]).all()
    return tmap(lambda x: torch.where(ok, x, torch.zeros_like(x)), tree), ok


def clip_by_l2(tree: Tree, clip: float | torch.Tensor) -> tuple[Tree, torch.Tensor]:
    """Scale ``tree`` so its flat L2 norm is at most ``clip``; also return the norm before
    clipping (in the leaves' dtype, at most its largest finite value). A non-finite ``tree`` is
    zeroed first (:func:`zero_if_not_finite`; its norm is then 0). ``clip`` may be a tensor (one per
    client under ``vmap``, e.g. in a run batch).

    The result's norm is within ``C (1 + 2^-22)`` (float32 rounding of the scale and the product),
    inside the slack the secure sum's sensitivity allows (:data:`fedlib.privacy.central.NORM_SLACK`),
    for every finite input: where the float32 scale ``C / norm`` would fall below the smallest normal
    float32 (norms beyond about ``1e38 C``, a malicious client's) or the norm itself overflows
    float32, the product is taken in float64 instead, since a subnormal scale keeps too few bits
    (property-tested with huge values)."""
    if not isinstance(clip, torch.Tensor) and not clip > 0:
        raise ValueError(f"clip norm must be > 0, got {clip}")
    tree, _ = zero_if_not_finite(tree)
    xs = leaves(tree)
    info = torch.finfo(xs[0].dtype)
    norm64 = _norm64(xs)
    norm = norm64.clamp_max(info.max).to(xs[0].dtype)  # equals flat_norm(tree) unless that overflows
    # exactly 1 unless the norm exceeds C (norm > C > 0, so the division is safe)
    scale = torch.where(norm > clip, clip / norm.clamp_min(clip), torch.ones_like(norm))
    precise = (norm64 > info.max) | (scale < info.tiny)
    scale64 = torch.where(norm64 > clip, clip / norm64.clamp_min(clip), torch.ones_like(norm64))
    return tmap(lambda x: torch.where(precise, (x.double() * scale64).to(x.dtype), x * scale.to(x.dtype)),
                tree), norm
