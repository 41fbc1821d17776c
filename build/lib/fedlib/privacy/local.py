"""Local-DP mechanisms applied by each client to its own flattened model update.

Every function works on a batch of clients at once: inputs are ``(m, d)`` (one row per
client) and randomness comes from an explicit ``torch.Generator``. What a client sends is
a *sparse* vector: a boolean ``mask`` of the dimensions it reports and the ``values`` there
(exactly zero elsewhere); on the wire that is ``mask.sum()`` (index, value) pairs.

* Exponential mechanism (McSherry & Talwar 2007) without replacement, by the Gumbel-top-k
  trick (Vieira 2014; Kool, van Hoof, Welling 2019): adding independent Gumbel(0, 1) noise to
  the log-weights and keeping the ``k`` largest gives the same ordered sample as ``k``
  sequential draws, each proportional to the weights of the items left.
* The two-point mechanism of LDP-FL (Sun, Qian, Chen, IJCAI 2021, Alg. 2).
* The exponential selection of SignDS-FL (Jiang, Zhou, Grossklags, ACM TIST 2022, Alg. 2),
  as in MindSpore Federated.
* Laplace noise on the released values.

The ``*_epsilon`` functions give the privacy each mechanism *actually* spends per client and
round (epsilon-LDP), by basic composition where several pieces are released.

Floating point. Released *values* that carry noise use the exact discrete Laplace on a grid
(:func:`discrete_laplace_values`, :mod:`fedlib.privacy.discrete`): pure epsilon, no float leak.
Released *choices* (which dimensions, which of two values) come from float64 uniforms
(53-bit): the exponential mechanism's probabilities and LDP-FL's Bernoulli are then off by a
relative ~1e-15 at most (every weight lies within a factor ``e^epsilon`` of every other, so no
probability is small enough for that to matter), which adds ~1e-15 to epsilon; uniform subsets
(SignDS-FL) are drawn exactly from integers.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedlib.privacy.discrete import discrete_laplace, grid_for
from fedlib.privacy.noise import laplace_noise_like
from fedlib.privacy.record import Release, SensitivityError, note, note_draw


# ---- the exponential mechanism without replacement ---------------------------------------
def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """``-log(-log u)``: standard Gumbel values of uniforms ``u`` in ``[0, 1)`` (inverse CDF). The
    atom ``u = 0`` (probability 2^-53 for 53-bit uniforms) is read as the smallest positive
    uniform, 2^-53, so that every value is finite (a ``-inf`` score would never be drawn)."""
    return -torch.log(-torch.log(u.clamp_min(2.0 ** -53)))


def gumbel(shape: tuple[int, ...], generator: torch.Generator, device=None) -> torch.Tensor:
    """Standard Gumbel noise in float64 from 53-bit uniforms (ties have probability ~1e-16 per
    pair), drawn from ``generator`` on its device (:func:`fedlib.privacy.noise.generator_for`) and
    moved to ``device``."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device)
    return gumbel_from_uniform(u).to(device)


def gumbel_top_k(log_weights: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Indices ``(m, k)`` of ``k`` items per row, sampled without replacement with
    probability proportional to ``exp(log_weights)`` (in draw order). Items with weight
    ``-inf`` are never drawn while others remain."""
    if not 0 <= k <= log_weights.shape[-1]:
        raise ValueError(f"k must be in [0, {log_weights.shape[-1]}], got {k}")
    noise = gumbel(tuple(log_weights.shape), generator, log_weights.device)
    note_draw("gumbel", noise)
    return torch.topk(log_weights.double() + noise, k, dim=-1).indices


def gumbel_top_k_mask(log_weights: torch.Tensor, counts: torch.Tensor,
                      generator: torch.Generator) -> torch.Tensor:
    """Boolean ``(m, d)`` mask of the first ``counts[i]`` draws of row ``i`` of
    :func:`gumbel_top_k`: ``mask_of(gumbel_top_k(log_weights, counts.max(), g), d, counts)``
    with the same Gumbel draws, found by a selection per row (``kthvalue``, linear time) instead
    of a sort of the ``counts.max()`` largest scores. FDL as published draws ~80 % of the CNN's
    1.7 M dimensions per client; there the sort took 0.13 s a client and the selection 0.014 s
    (this CPU, one thread). A row whose threshold is tied (the threshold score occurs more than
    once among its ``counts[i]`` largest, probability ~1e-16 a pair for 53-bit Gumbels, or
    ``counts[i]`` reaching the ``-inf`` items) makes the whole call fall back to the sort, so the
    mask is always the one the sort gives."""
    m, d = log_weights.shape
    counts = torch.as_tensor(counts, device=log_weights.device).reshape(-1)
    if counts.shape[0] != m or (m and not (int(counts.min()) >= 0 and int(counts.max()) <= d)):
        raise ValueError(f"counts must hold {m} values in [0, {d}], got {counts.tolist()}")
    noise = gumbel((m, d), generator, log_weights.device)
    note_draw("gumbel", noise)
    scores = log_weights.double() + noise
    mask = torch.zeros(m, d, dtype=torch.bool, device=log_weights.device)
    for i, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        threshold = torch.kthvalue(scores[i], d - c + 1).values
        row = scores[i] >= threshold
        if not torch.isfinite(threshold) or int(row.sum()) != c:
            k = int(counts.max())
            return mask_of(torch.topk(scores, k, dim=-1).indices, d, counts)
        mask[i] = row
    return mask


def exponential_mechanism_log_weights(utility: torch.Tensor, epsilon: float,
                                      sensitivity: float = 1.0) -> torch.Tensor:
    """``epsilon u / (2 Delta_u)``: the log-weights of the exponential mechanism, whose draw is
    ``epsilon``-DP when ``u`` changes by at most ``Delta_u`` between neighbouring inputs."""
    return epsilon * utility / (2.0 * sensitivity)


def exponential_top_k(utility: torch.Tensor, epsilon_per_draw: float, k: int, generator: torch.Generator,
                      sensitivity: float = 1.0) -> torch.Tensor:
    """``k`` draws without replacement (per row) by the exponential mechanism with utility in
    ``[0, sensitivity]`` (verified), each ``epsilon_per_draw``-DP: indices ``(m, k)``. Recorded as
    ``k * epsilon_per_draw`` per row (composition of the draws)."""
    u = utility.double()
    if u.numel() and not (torch.isfinite(u).all() and float(u.min()) >= 0 and float(u.max()) <= sensitivity):
        raise SensitivityError(f"utility outside [0, {sensitivity:g}]: the exponential mechanism's "
                               "bound fails")
    logw = exponential_mechanism_log_weights(u, epsilon_per_draw, sensitivity)
    note(Release("exponential_top_k", epsilon=k * epsilon_per_draw))
    return gumbel_top_k(logw, k, generator)


def highest_k(utility: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Indices ``(m, k)``: per row the ``k`` items of highest utility, ties broken uniformly at random;
    the limit of :func:`exponential_top_k` as epsilon grows (each draw then takes a remaining item of
    the highest utility, uniformly). Not private: corrected FDL's control without noise."""
    m, d = utility.shape
    if not 0 <= k <= d:
        raise ValueError(f"k must be in [0, {d}], got {k}")
    u = utility.double()
    top = u.amax(1, keepdim=True)
    if bool(((u == top).sum(1) >= k).all()):  # enough maxima in every row: uniform among them
        return gumbel_top_k(torch.where(u == top, 0.0, -math.inf), k, generator)
    order = torch.rand(m, d, generator=generator, dtype=torch.float64, device=generator.device).to(u.device)
    perm = order.argsort(1)  # a uniform order of the items, then a stable sort by utility
    ranked = torch.sort(u.gather(1, perm), dim=1, descending=True, stable=True).indices
    return perm.gather(1, ranked[:, :k])


def mask_of(indices: torch.Tensor, d: int, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``(m, d)`` mask of ``indices`` ``(m, k)``; with ``counts`` only the first
    ``counts[i]`` indices of row ``i`` (ragged selections padded to a common ``k``)."""
    m, k = indices.shape
    keep = torch.ones(m, k, dtype=torch.bool, device=indices.device)
    if counts is not None:
        keep = torch.arange(k, device=indices.device)[None, :] < counts[:, None]
    mask = torch.zeros(m, d, dtype=torch.bool, device=indices.device)
    return mask.scatter(1, indices, keep)


# ---- LDP-FL: the two-point mechanism ------------------------------------------------------------
def two_point(values: torch.Tensor, center: float, radius: float, epsilon: float,
              generator: torch.Generator) -> torch.Tensor:
    """LDP-FL's per-coordinate mechanism (Sun et al. 2021, Alg. 2) for values in
    ``[center - radius, center + radius]`` (clamped first): output
    ``center +/- radius (e^eps + 1) / (e^eps - 1)``, the + side with probability
    ``((w - c)(e^eps - 1) + r(e^eps + 1)) / (2 r (e^eps + 1))``. Unbiased; ``epsilon``-LDP
    per coordinate."""
    if not epsilon > 0 or not radius > 0:
        raise ValueError("two_point needs epsilon > 0 and radius > 0")
    w = values.double().clamp(center - radius, center + radius)
    e = math.exp(epsilon)
    note(Release("two_point", epsilon=epsilon * values.shape[-1]))  # each row: every coordinate
    p = ((w - center) * (e - 1) + radius * (e + 1)) / (2 * radius * (e + 1))
    u = torch.rand(w.shape, generator=generator, dtype=torch.float64, device=generator.device).to(w.device)
    note_draw("two_point", u)
    level = radius * (e + 1) / (e - 1)
    return torch.where(u < p, center + level, center - level).to(values.dtype)


# ---- SignDS-FL: exponential selection of the reported dimensions ---------------------------------
def signds_nu_log_probs(d: int, k: int, h: int, nu_th: int, epsilon: float) -> torch.Tensor:
    """``log Pr[nu = tau]``, ``tau = 0..h``: ``nu`` of the ``h`` reported dimensions come from the
    top-k set, ``Pr[tau] ∝ C(k, tau) C(d - k, h - tau) exp(epsilon 1[tau >= nu_th])`` (Jiang et
    al. 2022, eq. 9). The weights do not depend on the data, so the choice is epsilon-LDP."""
    tau = torch.arange(h + 1, dtype=torch.float64)

    def log_comb(n, r):
        n = torch.as_tensor(n, dtype=torch.float64)
        ok = (r >= 0) & (r <= n)
        val = torch.lgamma(n + 1) - torch.lgamma(r.clamp(0) + 1) - torch.lgamma((n - r).clamp(0) + 1)
        return torch.where(ok, val, torch.full_like(val, -math.inf))

    logw = log_comb(k, tau) + log_comb(d - k, h - tau) + epsilon * (tau >= nu_th).double()
    return logw - torch.logsumexp(logw, 0)


def signds_select(updates: torch.Tensor, k: int, h: int, nu_th: int, epsilon: float,
                  rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each client (row): a random sign ``s``; the top-k set of ``s * update``; ``nu`` drawn
    by :func:`signds_nu_log_probs`; ``nu`` dimensions uniform from the top-k set and ``h - nu``
    uniform from the rest (exact uniform subsets from integer draws). Returns
    ``(mask (m, d), signs (m,), nu (m,))``."""
    m, d = updates.shape
    dev = updates.device
    signs = torch.from_numpy(np.where(rng.integers(0, 2, size=m) == 0, -1.0, 1.0)).to(dev, updates.dtype)
    top = torch.topk(signs[:, None] * updates, k, dim=1).indices.cpu().numpy()
    note(Release("signds_selection", epsilon=epsilon))
    probs = signds_nu_log_probs(d, k, h, nu_th, epsilon).exp().numpy()
    nu = rng.choice(h + 1, size=m, p=probs / probs.sum())
    mask = np.zeros((m, d), dtype=bool)
    for i in range(m):
        inside = rng.choice(k, size=min(int(nu[i]), k), replace=False)
        mask[i, top[i, inside]] = True
        # the r-th dimension outside the top-k set, for r uniform without replacement:
        # r + #{top elements at or below it} (the sorted top set shifted by its ranks)
        shifted = np.sort(top[i]) - np.arange(k)
        r = rng.choice(d - k, size=h - int(nu[i]), replace=False)
        mask[i, r + np.searchsorted(shifted, r, side="right")] = True
        note_draw("signds_selection", r, inside, signs[i:i + 1], nu[i:i + 1])
    return torch.from_numpy(mask).to(dev), signs, torch.from_numpy(nu).to(dev)


# ---- values ----------------------------------------------------------------------------------
def discrete_laplace_values(values: torch.Tensor, mask: torch.Tensor, l1_sensitivity: float, epsilon: float,
                            rng: np.random.Generator) -> tuple[torch.Tensor, float]:
    """The masked entries of ``values`` (in ``[-1, 1]``) released with discrete Laplace noise on a
    grid of step 2^-30, floating-point safe; exactly 0 elsewhere. The noise scale is chosen for
    ``epsilon`` at L1 sensitivity ``l1_sensitivity`` of the released values (the range's end points
    lie on the grid, so rounding adds nothing to it), rounded up to whole grid steps; returns the
    release and the epsilon it actually spends (at most ``epsilon``)."""
    grid = grid_for(1.0)
    # what one client's entries can change by: 2 (the range [-1, 1]) per released entry of its row
    true_l1 = 2.0 * float(mask.reshape(-1, mask.shape[-1]).sum(-1).max()) if mask.numel() else 0.0
    if l1_sensitivity < true_l1:
        raise SensitivityError(f"L1 sensitivity {l1_sensitivity:g} is below what the released entries "
                               f"can change "
                         f"({true_l1:g}): the noise would be too small")
    scale_steps = math.ceil(l1_sensitivity / epsilon / grid.step)
    spent = true_l1 / grid.step / scale_steps
    note(Release("discrete_laplace", epsilon=spent))
    kept = values[mask].double().clamp(-1.0, 1.0).cpu().numpy()
    drawn = discrete_laplace(kept.size, scale_steps, rng)
    note_draw("discrete_laplace", drawn)
    noisy = grid.encode(kept) + drawn
    out = torch.zeros_like(values)
    out[mask] = torch.from_numpy(grid.decode(noisy)).to(values.device, values.dtype)
    return out, spent


def laplace_values(values: torch.Tensor, mask: torch.Tensor, scale: float,
                   generator: torch.Generator) -> torch.Tensor:
    """``values + Laplace(0, scale)`` on the masked entries (noise drawn for those only, in
    row-major order), exactly 0 elsewhere; continuous float64 noise (FDL as published only)."""
    zeros = torch.zeros(int(mask.sum()), dtype=values.dtype, device=values.device)
    noise = laplace_noise_like(zeros, scale, generator)
    note_draw("laplace", noise)
    out = torch.zeros_like(values)
    out[mask] = values[mask] + noise
    return out


# ---- privacy spent per client and round (epsilon-LDP) ----------------------------------------
def ldp_fl_epsilon(epsilon_per_coordinate: float, dims: int) -> float:
    """LDP-FL perturbs every coordinate independently: ``dims * epsilon`` by composition
    (the paper's shuffling/splitting is an anonymity argument, not an LDP bound)."""
    return dims * epsilon_per_coordinate


def signds_epsilon(epsilon: float) -> float:
    """SignDS-FL: one data-independent exponential choice of ``nu`` and uniform sets: epsilon."""
    return epsilon


def fdl_corrected_epsilon(epsilon_selection: float, epsilon_values: float) -> float:
    """Corrected FDL: ``k`` exponential draws at ``epsilon_selection / k`` each (composed: the
    selection is ``epsilon_selection``-LDP) plus ``k`` values with Laplace noise calibrated to
    their joint L1 sensitivity ``2k`` (``epsilon_values``): their sum."""
    return epsilon_selection + epsilon_values


def fdl_published_epsilon(epsilon: float, selected: int) -> dict[str, float]:
    """FDL as published: each of the ``th`` draws and each Laplace value uses ``epsilon``.
    Even ignoring the data-dependent filter and normalisation (which make the true value
    infinite), composing what is released gives ``2 th epsilon``."""
    return {"nominal": epsilon, "composed_ignoring_filter": 2 * selected * epsilon, "true": math.inf}
