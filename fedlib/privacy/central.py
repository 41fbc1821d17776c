"""Gaussian releases of clipped client updates: the noise of central and local client-level DP.

* :func:`noisy_sum` - central DP (McMahan, Ramage, Talwar, Zhang, ICLR 2018, Alg. 1): the
  server adds Gaussian noise of std ``z x sensitivity`` to the *sum* of the clients' clipped
  updates; the caller divides by a public denominator. MOON-DPAP and DP-FedAvg both use it.
* :func:`noisy_one` - local DP: a client adds noise to its own clipped update before it
  leaves (the same mechanism on a sum of one).
* :func:`noisy_count` - a Gaussian count (adaptive clipping's count of unclipped updates,
  Andrew et al. 2021).
* :class:`AdaptiveClipping` - the private quantile estimate of the update norms (Andrew,
  Thakkar, McMahan, Ramaswamy, NeurIPS 2021, Alg. 1) that moves the clip norm between rounds.

Sensitivity: ``relation.sensitivity_factor x C`` (C for add/remove-one with a fixed
denominator, 2C for replace-one).

``secure=True`` (the default everywhere): every clipped update is rounded to a power-of-two
grid (:func:`fedlib.privacy.discrete.grid_for`), the sum is formed exactly in integers and
exact discrete Gaussian noise is added, so no output reveals its input through floating-point
rounding (:mod:`fedlib.privacy.discrete`). Rounding moves each coordinate of each update by at
most half a grid step, which can add ``sqrt(d) / 2`` grid steps (per rounded update that differs
between neighbours) to the L2 sensitivity; the noise std is set to ``z`` times that enlarged
sensitivity, so the accounting of ``z`` holds as stated. The clipped norm itself is allowed a
relative ``2^-20`` of float32 rounding. ``secure=False`` is the textbook float32 Gaussian (kept
to show Mironov's attack in the tests).

The exact discrete Gaussian is drawn on the host (numpy), about 0.3 s for the CNN's 424k
coordinates on one core: on a GPU that is longer than the round's training (0.1-0.15 s on an
H200). The draws depend only on the key, the sizes and sigma, never on the data, so
:func:`prefetch_noisy_sum` can start them in worker processes (:func:`noise_workers` of them)
before they are needed, a run's next :data:`ROUNDS_AHEAD` rounds at once, and :func:`noisy_sum`
takes them when it runs: the same generator and calls, the same values, drawn while the clients
train. Processes, not threads, by default (the ``noise_pool`` option of :mod:`fedlib.kernels`): the
sampler's rejection loops are many small NumPy operations, each taking the GIL, so 8 threads on
the H200 machine drew only 2.4x as fast as one and held up the training thread's launches. The
processes start from a fork server that has imported this module (no CUDA in it, so forking is
safe); like any worker process that is not forked, each imports the main script, so a script
must keep its work under ``if __name__ == "__main__":`` (one that does not is told so by the
worker, whose failure then breaks the pool). A pool that breaks (a worker killed) is dropped with
one warning and the noise is drawn where it is needed, the same values.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import warnings
from collections import OrderedDict
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from fedlib import kernels
from fedlib.privacy.discrete import Grid, discrete_gaussian, grid_for, rng_for
from fedlib.privacy.guarantee import Relation
from fedlib.privacy.noise import gaussian_noise_like, generator_for
from fedlib.privacy.record import Release, SensitivityError, note, note_draw
from fedlib.tree import Tree, leaves, tmap

#: Relative allowance for float32 rounding in a clipped update's norm (``clip_by_l2`` computes the
#: norm in float64 and scales in float32: the result exceeds C by at most ~1e-7 relative).
NORM_SLACK = 2.0**-20


#: How many rounds of a run's server noise are drawn ahead (the round beginning and the next ones):
#: enough for several noise workers to draw one run's noise at once.
ROUNDS_AHEAD = 8
#: Noise of :func:`noisy_sum` being drawn ahead (:func:`prefetch_noisy_sum`), by what determines it;
#: at most :data:`ROUNDS_AHEAD` rounds of each run of a run batch (the campaign batches up to a few
#: dozen runs; 3.4 MB a round for the CNN), the oldest dropped first when full (drawn again by
#: noisy_sum if it still comes: the same values, only later).
_AHEAD: OrderedDict[tuple, Future] = OrderedDict()
_AHEAD_MAX = 256
#: The worker pool of each kind (``noise_pool``), started at the first draw ahead.
_POOLS: dict[str, Executor] = {}
#: Why drawing ahead stopped in this process (a broken pool); empty while it works.
_BROKEN: list[str] = []


def noise_workers(kind: str | None = None) -> int:
    """Workers that draw noise ahead: the cores left beside the training thread and one for the
    host's other work, at least 1; threads at most 8 (they gain little beyond), processes at most
    32 (16 cores on the lent GPU machines: 14 processes or 8 threads). ``kind``: ``processes`` or
    ``threads``, by default the ``noise_pool`` option."""
    kind = kind or kernels.noise_pool()
    return max(1, min(8 if kind == "threads" else 32, (os.cpu_count() or 2) - 2))


def _ignore_interrupts() -> None:
    """A noise worker leaves Ctrl-C (SIGINT) to its parent, which stops the run and its pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def noise_pool(kind: str | None = None) -> Executor:
    """The pool of ``kind`` (by default the ``noise_pool`` option) that draws noise ahead,
    started on first use: :func:`noise_workers` threads, or as many processes forked from a fork
    server that has imported this module (spawned where a fork server is not available)."""
    kind = kind or kernels.noise_pool()
    if kind not in _POOLS:
        workers = noise_workers(kind)
        if kind == "threads":
            _POOLS[kind] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedlib-noise")
        else:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            ctx = mp.get_context(method)
            if method == "forkserver":
                ctx.set_forkserver_preload([__name__])  # takes effect if the server is not yet running
            _POOLS[kind] = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                               initializer=_ignore_interrupts)
    return _POOLS[kind]


def _stop_drawing_ahead(why: BaseException) -> None:
    """A pool broke: warn once, forget what it was drawing, draw where needed from now on."""
    if not _BROKEN:
        _BROKEN.append(f"{type(why).__name__}: {why}")
        warnings.warn(f"the server noise could not be drawn ahead ({_BROKEN[0]}); it is drawn when "
                      "needed instead (the same values, only later)", RuntimeWarning, stacklevel=3)
    _AHEAD.clear()
    for pool in _POOLS.values():
        pool.shutdown(wait=False, cancel_futures=True)
    _POOLS.clear()


def _sizes(tree: Tree, leading: int) -> tuple:
    """What the noise of a tree depends on besides key and sigma: each leaf's name (for a dict) and
    coordinate count, without the first ``leading`` dimensions, in the order the leaves are drawn."""
    named = tree.items() if isinstance(tree, dict) else enumerate(leaves(tree))
    return tuple((k, math.prod(v.shape[leading:])) for k, v in named)


def _discrete_sigma(clip: float, noise_multiplier: float, relation: Relation, dims: int) -> float:
    """The discrete Gaussian's std, in grid steps, for ``noise_multiplier`` times the sensitivity."""
    sigma = noise_multiplier * grid_sensitivity(clip, relation, dims, grid_for(clip))
    return sigma


def _draw_all(sizes: tuple, sigma: float, rng: np.random.Generator) -> list[np.ndarray]:
    return [discrete_gaussian(n, sigma, rng) for _, n in sizes]


def draw_keyed(sizes: tuple, sigma: float, seed: tuple[int, ...]) -> list[np.ndarray]:
    """What a noise worker runs: every leaf's discrete Gaussian from ``seed``'s stream (the stream
    of :func:`~fedlib.privacy.discrete.rng_for`, not noted: :func:`noisy_sum` notes the key when it
    takes the draws), in the order :func:`noisy_sum` draws them."""
    return _draw_all(sizes, sigma, np.random.default_rng(np.random.SeedSequence(list(seed))))


def prefetch_noisy_sum(like: Tree, clip: float, noise_multiplier: float, relation: Relation,
                       seed: tuple[int, ...]) -> None:
    """Start drawing, in a noise worker (:func:`noise_pool`), the discrete Gaussian noise that
    ``noisy_sum(clipped, clip, noise_multiplier, relation, seed)`` will add to updates shaped like
    ``like`` (one client's tree, no leading dimension): the same generator (``seed``) and the same
    calls in the same order, so the same values, which :func:`noisy_sum` takes instead of drawing
    them (when the key, the sizes and sigma all match; else it draws as usual). Nothing is released
    here: the noise alone is independent of the data. The secure path only (the float path is one
    fast draw)."""
    if noise_multiplier <= 0 or _BROKEN:
        return
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a noise worker process of fedlib is importing your main script, and the script trains "
            "when imported: put its work under `if __name__ == \"__main__\":` (Python's rule for "
            "programs whose worker processes are not forked; the run itself goes on, drawing its "
            "noise where needed)")
    sizes = _sizes(like, 0)
    sigma = _discrete_sigma(clip, noise_multiplier, relation, sum(n for _, n in sizes))
    seed = tuple(int(p) for p in seed)
    key = (seed, sizes, sigma)
    if key in _AHEAD:
        return
    try:
        _AHEAD[key] = noise_pool().submit(draw_keyed, sizes, sigma, seed)
    except Exception as e:  # noqa: BLE001 - a broken pool (BrokenProcessPool, a failed start)
        _stop_drawing_ahead(e)
        return
    while len(_AHEAD) > _AHEAD_MAX:
        _AHEAD.popitem(last=False)


def grid_sensitivity(clip: float, relation: Relation, dims: int, grid: Grid) -> float:
    """L2 sensitivity, in grid steps, of a sum of rounded updates clipped to ``clip``."""
    factor = relation.sensitivity_factor
    return factor * clip * (1 + NORM_SLACK) / grid.step + factor * math.sqrt(dims) / 2


def _rounded(x: torch.Tensor, grid: Grid) -> torch.Tensor:
    return torch.round(x.double() / grid.step).long()


def _decode(n: torch.Tensor, grid: Grid, like: torch.Tensor) -> torch.Tensor:
    return (n.double() * grid.step).to(like.dtype)


def check_rows(clipped: Tree, clip: float) -> None:
    """Every row (leading dimension) of ``clipped`` is finite with flat L2 norm at most ``clip``
    (relative slack :data:`NORM_SLACK` for float32 rounding), else
    :class:`~fedlib.privacy.record.SensitivityError`."""
    xs = leaves(clipped)
    if not xs or xs[0].shape[0] == 0:
        return
    sq = sum((x.double() ** 2).reshape(x.shape[0], -1).sum(1) for x in xs)
    if not torch.isfinite(sq).all():
        raise SensitivityError("an update entering the noisy sum is not finite: it was not clipped")
    worst = float(sq.max().sqrt())
    if worst > clip * (1 + NORM_SLACK):
        raise SensitivityError(f"an update entering the noisy sum has norm {worst:.6g} > clip {clip:.6g}: "
                               "it was not clipped to the norm the noise is calibrated for")


def noisy_sum(
    clipped: Tree,
    clip: float,
    noise_multiplier: float,
    relation: Relation,
    seed: tuple[int, ...],
    secure: bool = True,
    mask: Tree | None = None,
) -> Tree:
    """``sum_i clipped_i + N(0, (z Delta)^2 I)`` over the leading (client) dimension of every leaf.

    ``seed``: the integers that key the noise stream (config key, stream, round). ``mask``: a
    public 0/1 tree (pruning); masked coordinates get no noise (and carry no update).

    The sensitivity is verified, not assumed: every row must be finite with L2 norm at most
    ``clip`` (up to float32 rounding, :data:`NORM_SLACK`), else
    :class:`~fedlib.privacy.record.SensitivityError`. The release is recorded
    (:func:`fedlib.privacy.record.note`) with the multiplier of the noise actually drawn against that
    sensitivity."""
    check_rows(clipped, clip)
    if noise_multiplier <= 0:
        note(Release("gaussian_sum", noise_multiplier=0.0))
        return tmap(lambda x: x.sum(0), clipped)
    if not secure:
        total = tmap(lambda x: x.sum(0), clipped)
        std = noise_multiplier * relation.sensitivity_factor * clip
        noise = gaussian_noise_like(total, std, generator_for(*seed))
        note(Release("gaussian_sum", noise_multiplier=std / (relation.sensitivity_factor * clip)))
        note_draw("gaussian_sum", *leaves(noise))
        if mask is not None:
            noise = tmap(lambda n, m: n * m.to(n.dtype), noise, mask)
        return tmap(torch.add, total, noise)
    grid = grid_for(clip)
    sizes = _sizes(clipped, 1)
    dims = sum(n for _, n in sizes)
    sigma = _discrete_sigma(clip, noise_multiplier, relation, dims)
    note(Release("gaussian_sum", noise_multiplier=sigma / grid_sensitivity(clip, relation, dims, grid)))
    rng = rng_for(*seed)
    ready = _drawn_ahead((tuple(int(p) for p in seed), sizes, sigma))
    drawn: list[np.ndarray] = []

    def release(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        total = _rounded(x, grid).sum(0)
        drawn.append(next(ready) if ready is not None else discrete_gaussian(total.numel(), sigma, rng))
        noise = torch.from_numpy(drawn[-1]).view(total.shape).to(total.device)
        if m is not None:
            noise = noise * (m != 0).long()
        return _decode(total + noise, grid, x)

    out = tmap(lambda x: release(x, None), clipped) if mask is None else tmap(release, clipped, mask)
    note_draw("gaussian_sum", *drawn)
    return out


def _drawn_ahead(key: tuple):
    """The draws made ahead for ``key``, one array per leaf, or None (none started, or the pool
    broke: then :func:`noisy_sum` draws them itself from the same stream)."""
    ahead = _AHEAD.pop(key, None)
    if ahead is None:
        return None
    try:
        return iter(ahead.result())
    except Exception as e:  # noqa: BLE001 - a worker died (BrokenProcessPool) or could not start
        _stop_drawing_ahead(e)
        return None


def noisy_one(
    clipped: Tree,
    clip: float,
    noise_multiplier: float,
    seed: tuple[int, ...],
    secure: bool = True,
    mask: Tree | None = None,
) -> Tree:
    """Local DP: one client's clipped update (a leading dimension of 1 on every leaf) released
    with its own Gaussian noise, keyed by ``seed`` (the client's stream), without the leading
    dimension. Replace-one: the sensitivity of one client's message is ``2C``; the same mechanism
    as :func:`noisy_sum` on a sum of one."""
    if any(x.shape[0] != 1 for x in leaves(clipped)):
        raise ValueError("noisy_one releases one client's update: leading dimension 1 on every leaf")
    return noisy_sum(clipped, clip, noise_multiplier, Relation.REPLACE_ONE, seed, secure, mask)


#: Grid of the counts (multiples of 1/2): exact, with room for 2^20 steps per half.
COUNT_GRID = Grid(2.0**-21)


def noisy_count(values: torch.Tensor, std: float, seed: tuple[int, ...], secure: bool = True,
                sensitivity: float = 0.5) -> float:
    """``sum(values) + N(0, std^2)`` for values on the half-integer grid (e.g. ``b_i - 1/2``), each
    within ``[-sensitivity, sensitivity]`` (verified: adding or removing one unit moves the sum by
    at most that); the release is recorded with multiplier ``std / sensitivity``."""
    v = values.double()
    if len(v) and not (torch.isfinite(v).all() and float(v.abs().max()) <= sensitivity):
        raise SensitivityError(f"a value of the noisy count lies outside [-{sensitivity:g}, {sensitivity:g}]")
    total = float(v.sum())
    if std <= 0:
        note(Release("gaussian_count", noise_multiplier=0.0))
        return total
    if not secure:
        note(Release("gaussian_count", noise_multiplier=std / sensitivity))
        draw = float(torch.randn((), generator=generator_for(*seed), dtype=torch.float64))
        note_draw("gaussian_count", np.array([draw]))
        return total + draw * std
    steps = std / COUNT_GRID.step  # the noise std in grid steps: what is drawn, and recorded
    note(Release("gaussian_count", noise_multiplier=steps * COUNT_GRID.step / sensitivity))
    n = int(COUNT_GRID.encode(np.array(total)))
    noise = int(discrete_gaussian(1, steps, rng_for(*seed))[0])
    note_draw("gaussian_count", np.array([noise]))
    return float(COUNT_GRID.decode(np.array(n + noise)))


@dataclass(frozen=True)
class AdaptiveClipping:
    """Andrew et al. (2021): ``C <- C exp(-eta_C (b - gamma))`` with ``b`` the noised fraction of
    unclipped updates, ``(sum_i (b_i - 1/2) + N(0, sigma_b^2)) / n + 1/2`` (sensitivity 1/2 after
    the shift). The update noise then takes ``z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2``, so that the
    two Gaussian queries together are exactly as private as one with multiplier ``z`` (their RDP
    curves add: ``1/z^2 = 1/z_Delta^2 + (1/2)^2/sigma_b^2``)."""

    target_quantile: float
    learning_rate: float
    count_std: float

    def update_multiplier(self, z: float) -> float:
        """The noise multiplier left for the update once the count takes its share: with ``z`` for both,
        ``z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2`` (Andrew et al. 2021, Thm 1), so that the round's two
        releases together spend what ``z`` alone would."""
        if z <= 0:
            return 0.0
        if not z < 2 * self.count_std:
            raise ValueError(f"adaptive clipping needs z < 2 sigma_b = {2 * self.count_std:g}, got {z}")
        return (z**-2 - (2 * self.count_std) ** -2) ** -0.5

    def next_clip(
        self,
        clip: float,
        unclipped: torch.Tensor,
        denominator: float,
        seed: tuple[int, ...],
        secure: bool = True,
    ) -> float:
        """The next round's clip norm: the share ``b`` of clients whose update was within ``C``, from their
        noisy count (exact discrete Gaussian of std ``sigma_b`` on the grid), moves ``C`` geometrically
        towards the target quantile, ``C exp(-eta_C (b - gamma))`` (Andrew et al. 2021, Alg. 1)."""
        count = noisy_count(unclipped - 0.5, self.count_std, seed, secure)
        b = min(1.0, max(0.0, count / denominator + 0.5))
        return clip * math.exp(-self.learning_rate * (b - self.target_quantile))
