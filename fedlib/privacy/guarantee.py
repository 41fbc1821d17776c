"""What an epsilon means, and the run-level accountant that computes it.

A :class:`Guarantee` names who is protected (a client's whole data, or one record), against
which change of the data set (the *neighbouring relation*), and where the noise is added (a
trusted server, or each client before anything leaves it). The sensitivity of a sum of updates
clipped to L2 norm ``C`` follows from the relation: ``C`` when one client is added or removed
(with a *fixed*, public denominator), ``2C`` when one client's data are replaced by anything.

The :class:`Accountant` is fed one privacy event per round (as Opacus and dp-accounting do) and
reports the epsilon spent so far: Gaussian releases by RDP at integer orders (which holds for
the discrete Gaussian noise fedlib adds, :mod:`fedlib.privacy.accounting`), pure-epsilon local
releases by basic composition.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

import numpy as np

from fedlib.privacy.accounting import INTEGER_ORDERS, epsilon_from_rdp, rdp_curve


class Relation(StrEnum):
    """Neighbouring data sets: which change the guarantee covers."""

    ADD_REMOVE = "add/remove one"
    REPLACE_ONE = "replace one"

    @property
    def sensitivity_factor(self) -> int:
        """The L2 sensitivity of a sum of updates clipped to norm C, in units of C."""
        return 1 if self is Relation.ADD_REMOVE else 2


#: Run-history metrics that are released under a run's guarantee: the global model and what is
#: computed from it on public data, the schedule, and the accounting. Everything else a history
#: holds (training loss, update norms, the number of sampled clients, bytes sent, ...) is computed
#: from private data outside the mechanism: a *diagnostic* that the guarantee does not cover.
RELEASED_METRICS = frozenset(
    {
        "round",
        "test_acc",
        "test_loss",
        "weight_norm",
        "dead_units",
        "predicted_classes",
        "epsilon_spent",
        "epsilon_round",
        "noise_multiplier",
        "clip",
        "next_clip",
        "lr",
        "tau",
        "mu",
        "sparsity",
        "sent_frac",
    }
)


def is_released(metric: str) -> bool:
    """Whether a history metric is released under a run's guarantee (:data:`RELEASED_METRICS`), or a
    diagnostic computed from private data outside the mechanism."""
    return metric in RELEASED_METRICS


#: Result metadata (``meta``) fields that reveal nothing about any client's data beyond what the
#: guarantee covers: provenance (the machine, versions, commit, timing), what the configuration
#: and code determine (the key, the seed, the data set's identity and sizes, the privacy statement),
#: bookkeeping (hashes, migrations, engines).
PUBLIC_META = frozenset({
    "device", "engine", "torch", "numpy", "python", "platform", "cpu", "cpu_threads", "git_commit", "seed",
    "config_key", "resumed_from_round", "resumed_from_commit", "resumed_from_engine", "trained_in",
    "duration_s",
    "train_samples", "test_samples", "data_sha256",
    "reproducible", "privacy", "run_batch", "content_sha256", "migrated_from", "flower",
    "kernels", "collapse",
})
#: Result metadata computed from the clients' data outside any mechanism: diagnostics the guarantee
#: does not cover (a deployment would not publish them). ``client_sizes``: how many samples each client
#: holds (private under client-level replace-one and record-level add/remove); ``diverged``: whether a
#: loss went non-finite (it reads the training losses too).
DIAGNOSTIC_META = frozenset({"client_sizes", "diverged"})


def classify_meta(meta: dict) -> dict[str, list[str]]:
    """``meta``'s fields as ``public`` and ``diagnostic`` (:data:`PUBLIC_META`,
    :data:`DIAGNOSTIC_META`); a field in neither is an error, so a new field cannot slip in
    unclassified."""
    unknown = sorted(set(meta) - PUBLIC_META - DIAGNOSTIC_META)
    if unknown:
        raise ValueError(f"result metadata fields classified neither public nor diagnostic: {unknown}")
    return {"public_meta": sorted(set(meta) & PUBLIC_META),
            "diagnostic_meta": sorted(set(meta) & DIAGNOSTIC_META)}


@dataclass(frozen=True)
class Guarantee:
    """The privacy statement of a run: ``epsilon`` (from the accountant) at ``delta``."""

    unit: str  # "client" (a client's whole data) or "record"
    relation: Relation
    where: str  # "central" (noise added by a trusted server) or "local" (by each client)
    delta: float  # 0 for pure epsilon-DP
    mechanism: str  # e.g. "discrete Gaussian on the sum of clipped updates"

    def describe(self, epsilon: float | None = None) -> str:
        """The guarantee in words, with the ``epsilon`` a run spent: budget, unit, relation, where the noise
        is added and by which mechanism."""
        eps = "" if epsilon is None else (f"ε = {epsilon:.3g}" if math.isfinite(epsilon) else "ε = ∞")
        delta = f", δ = {self.delta:g}" if self.delta else " (pure)"
        return (
            f"{eps}{delta}; {self.unit}-level, {self.relation.value} {self.unit}, "
            f"{self.where} ({self.mechanism})"
        ).lstrip("; ")

    def to_dict(self) -> dict:
        """The guarantee as plain data, for a result's metadata."""
        d = asdict(self)
        d["relation"] = self.relation.value
        return d


@dataclass(frozen=True)
class GaussianEvent:
    """``count`` Gaussian releases (e.g. the local steps of a round of DP-SGD): noise std
    ``noise_multiplier`` x sensitivity, each unit taking part with probability ``sampling_rate``
    (Poisson sampling)."""

    noise_multiplier: float
    sampling_rate: float = 1.0
    count: int = 1


@dataclass(frozen=True)
class PureEvent:
    """One ``epsilon``-DP release (e.g. a client's message under local DP)."""

    epsilon: float


class Accountant:
    """The epsilon a run has spent, fed one event per round."""

    def __init__(self, delta: float):
        self.delta = delta
        self.rdp = np.zeros(len(INTEGER_ORDERS))
        self.pure = 0.0
        self.gaussian_rounds = 0

    def step(self, event: GaussianEvent | PureEvent | None) -> None:
        """Compose one round's event: a Gaussian event adds its RDP curve (``count`` releases at the
        sampling rate), a pure one its epsilon; ``None`` (no release) adds nothing."""
        if event is None:
            return
        if isinstance(event, GaussianEvent):
            curve = rdp_curve(float(event.noise_multiplier), float(event.sampling_rate))
            self.rdp = self.rdp + event.count * curve
            self.gaussian_rounds += 1
        else:
            self.pure += event.epsilon

    def epsilon(self) -> float:
        """Epsilon at ``delta`` so far (pure events add; a run has one kind or the other)."""
        if self.gaussian_rounds == 0:
            return self.pure
        return epsilon_from_rdp(self.rdp, self.delta) + self.pure

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the accountant: the composed RDP curve and pure epsilon."""
        return {"rdp": self.rdp.tolist(), "pure": self.pure, "gaussian_rounds": self.gaussian_rounds}

    def load_state_dict(self, d: dict) -> None:
        """Resume from :meth:`state_dict`'s data."""
        self.rdp = np.array(d["rdp"], dtype=np.float64)
        self.pure, self.gaussian_rounds = d["pure"], d["gaussian_rounds"]
