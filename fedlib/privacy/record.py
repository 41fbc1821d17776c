"""What each privacy mechanism actually did, recorded by the mechanism itself.

A mechanism (:func:`fedlib.privacy.central.noisy_sum`, :func:`~fedlib.privacy.central.noisy_count`,
the local randomisers of :mod:`fedlib.privacy.local`, record-level DP-SGD's step noise) notes one
:class:`Release` per call, computed from the parameters it used and the inputs it checked (the
noise it drew against the sensitivity it verified), not from the configuration. The run's
accountant is fed these records (:meth:`fedlib.experiment.Experiment.aggregate`), and each round they are
compared with what the algorithm promises for its configuration (``Algorithm.privacy_event``): a
call site that adds half the noise, spends a per-draw budget k times, or skips a mechanism makes
the two disagree, and the run stops with :class:`PrivacyMismatch` instead of publishing a false
epsilon.

Records are collected per thread of work with :func:`recording` (a context variable): the server's
step on the host, each client's release where the client runs (a worker process, a Flower node);
a client's records travel back with its metrics as two numbers (:func:`client_summary`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Release:
    """One mechanism call. Gaussian: ``noise_multiplier`` = noise std / the L2 sensitivity the
    mechanism verified. Pure: ``epsilon`` spent by each unit (a client's row) of the call."""

    mechanism: str
    noise_multiplier: float | None = None
    epsilon: float | None = None

    def __post_init__(self):
        if (self.noise_multiplier is None) == (self.epsilon is None):
            raise ValueError("a release is Gaussian (noise_multiplier) or pure (epsilon), not both")


class PrivacyMismatch(RuntimeError):
    """What the mechanisms released does not match what the configuration promises."""


class SensitivityError(ValueError):
    """An input that breaks the bound a mechanism's noise is calibrated for (an unclipped update,
    a value outside its range, a sensitivity stated below what the inputs can change)."""


_LOG: ContextVar[list[Release] | None] = ContextVar("fedlib_privacy_log", default=None)


@contextmanager
def recording() -> Iterator[list[Release]]:
    """Collect the releases made inside the ``with`` block (nested blocks collect their own)."""
    log: list[Release] = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def note(release: Release) -> None:
    """Record ``release`` in the innermost :func:`recording` block, if any (tests of a mechanism
    alone run outside one)."""
    log = _LOG.get()
    if log is not None:
        log.append(release)


@dataclass(frozen=True)
class Draw:
    """What one mechanism call drew, as the mechanism saw it: its first ``DRAW_HEAD`` values and
    a digest of all of them (float64 bytes). Tests of independence read these: two releases keyed
    alike (the same round, client or step in a key) draw the same values, which a digest or a
    correlation shows."""

    mechanism: str
    size: int
    head: tuple[float, ...]
    digest: str


#: How many values of each draw a :class:`Draw` keeps.
DRAW_HEAD = 64
class DrawLog(list):
    """The draws of a :func:`drawing` block (a list of :class:`Draw`), and in ``keys`` the key of
    every keyed generator built in it, as ``(kind, key)``: ``kind`` is the generator's algorithm
    (``torch`` for :func:`fedlib.privacy.noise.generator_for` and record-level step noise,
    ``numpy`` for :func:`fedlib.privacy.discrete.rng_for`), ``key`` the integers it was seeded from.
    Two generators of one kind built from the same key produce the same stream: two releases that
    share it are correlated even where their draws are too short to show it."""

    def __init__(self):
        super().__init__()
        self.keys: list[tuple[str, tuple[int, ...]]] = []


_DRAWS: ContextVar[DrawLog | None] = ContextVar("fedlib_privacy_draws", default=None)


@contextmanager
def drawing() -> Iterator[DrawLog]:
    """Collect the draws of every mechanism called inside the ``with`` block, and the keys of the
    generators they drew from (same thread; an engine path that releases in worker processes does
    not report them). Outside one, nothing is kept."""
    log = DrawLog()
    token = _DRAWS.set(log)
    try:
        yield log
    finally:
        _DRAWS.reset(token)


def draws_noted() -> bool:
    """Whether a :func:`drawing` block is open (a caller that would loop only to note its draws
    asks first)."""
    return _DRAWS.get() is not None


def note_key(kind: str, parts) -> None:
    """Record that a generator of ``kind`` was seeded from the integers ``parts`` (see
    :class:`DrawLog`), in the innermost :func:`drawing` block, if any."""
    log = _DRAWS.get()
    if log is not None:
        log.keys.append((kind, tuple(int(p) for p in parts)))


def note_draw(mechanism: str, *parts) -> None:
    """Record the values a mechanism drew (numpy arrays or tensors, concatenated in order) in the
    innermost :func:`drawing` block, if any."""
    log = _DRAWS.get()
    if log is None:
        return
    arrays = [np.asarray(p.detach().cpu().double() if hasattr(p, "detach") else p, dtype=np.float64).ravel()
              for p in parts]
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    log.append(Draw(mechanism, int(values.size), tuple(values[:DRAW_HEAD].tolist()),
                    hashlib.sha256(values.tobytes()).hexdigest()))


def combined_multiplier(records: list[Release]) -> float | None:
    """The one Gaussian multiplier equivalent to all Gaussian ``records`` of one unit's round (RDP
    of Gaussians adds: ``z^-2 = sum_i z_i^-2``); None without any. A zero multiplier (no noise)
    gives 0."""
    zs = [r.noise_multiplier for r in records if r.noise_multiplier is not None]
    if not zs:
        return None
    if any(z <= 0 for z in zs):
        return 0.0
    return sum(z**-2 for z in zs) ** -0.5


def total_epsilon(records: list[Release]) -> float | None:
    """The pure epsilon of all pure ``records`` of one unit's round (basic composition); None
    without any."""
    eps = [r.epsilon for r in records if r.epsilon is not None]
    return sum(eps) if eps else None


def client_summary(records: list[Release]) -> dict[str, float]:
    """A client's release records as statistics that travel with its metrics."""
    out = {}
    z, eps = combined_multiplier(records), total_epsilon(records)
    if z is not None:
        out["privacy_z"] = z
    if eps is not None:
        out["privacy_epsilon"] = eps
    return out


def check(declared, recorded_z: float | None, recorded_eps: float | None, where: str) -> None:
    """Raise :class:`PrivacyMismatch` unless the records back the ``declared`` event: a Gaussian
    event needs records whose combined multiplier is at least the declared one (more noise is
    safe), a pure event needs records whose epsilon is at most the declared one."""
    from fedlib.privacy.guarantee import GaussianEvent

    if declared is None:
        return
    rel = 1e-9
    if isinstance(declared, GaussianEvent):
        if recorded_z is None:
            raise PrivacyMismatch(f"{where}: the configuration promises Gaussian noise of multiplier "
                                  f"{declared.noise_multiplier:.6g}, but no mechanism released any")
        if recorded_z < declared.noise_multiplier * (1 - rel):
            raise PrivacyMismatch(f"{where}: the mechanisms released noise of multiplier {recorded_z:.6g}, "
                                  f"the configuration promises {declared.noise_multiplier:.6g}")
        return
    if math.isinf(declared.epsilon):
        return
    if recorded_eps is None:
        raise PrivacyMismatch(f"{where}: the configuration promises an epsilon-DP release, but no "
                              "mechanism released any")
    if recorded_eps > declared.epsilon * (1 + rel):
        raise PrivacyMismatch(f"{where}: the mechanisms spent epsilon {recorded_eps:.6g}, the "
                              f"configuration promises {declared.epsilon:.6g}")


def check_clients(promised: list[float], recorded_z: list[float], clients: list[int], where: str) -> None:
    """Raise :class:`PrivacyMismatch` unless every client's recorded multiplier is at least the one
    promised to it (clients calibrated apart: record-level DP-SGD with a sigma per client, where one
    round-wide minimum would compare the most-noised client's records with the least-noised one's
    promise)."""
    if not len(promised) == len(recorded_z) == len(clients):
        raise PrivacyMismatch(f"{where}: {len(recorded_z)} clients' records for {len(promised)} promises")
    rel = 1e-9
    for client, want, got in zip(clients, promised, recorded_z, strict=True):
        if not got >= want * (1 - rel):  # also catches a NaN record
            raise PrivacyMismatch(f"{where}: client {client} released noise of multiplier {got:.6g}, "
                                  f"the configuration promises it {want:.6g}")


__all__ = ["Draw", "PrivacyMismatch", "Release", "SensitivityError", "check", "check_clients",
           "client_summary", "combined_multiplier", "drawing", "note", "note_draw", "recording",
           "total_epsilon"]
