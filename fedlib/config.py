"""Experiment configuration, validation and the three run profiles.

A :class:`Config` says *what* is computed; it fully determines a result (together with
the code version), so its hash keys the results cache (:mod:`fedlib.results`). *How* it
is executed (engine path, device, checkpoint interval) is passed separately to
:func:`fedlib.run` and does not change the result beyond floating-point rounding.

Profiles (:data:`PROFILES`) shrink a paper-scale config to fit a machine:

* ``smoke``: seconds; used by the tests.
* ``quick``: the default of ``make book``; minutes on a 2-core CPU, reduced data and rounds.
* ``paper``: the papers' own settings; meant for a GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: Bump when a change to the code alters results, so that old cache entries are not reused;
#: results that the change leaves as they were are carried over by ``python -m fedlib.tools.migrate``
#: (one rule per version there). 2: privacy noise is floating-point safe, keyed on the whole
#: config; MOON-DPAP's central noise follows replace-one (sensitivity 2C).
RESULTS_VERSION = 2

DATASET_SIZES = {"fashionmnist": (60_000, 10_000), "mnist": (60_000, 10_000)}
MODELS = ("cnn", "mcmahan_cnn", "mlp")
PARTITIONS = ("iid", "dirichlet", "shards")
PRECISIONS = ("float32", "bfloat16", "float64")


class ConfigError(ValueError):
    """A configuration that cannot be run; raised before any work starts."""


def _param(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    """One federated experiment. Every field has a default and a help text (``--help``)."""

    algorithm: str = _param("fedavg", "federated algorithm (see fedlib.algorithms.ALGORITHMS)")
    dataset: str = _param("fashionmnist", "dataset: fashionmnist or mnist")
    model: str = _param("cnn", "cnn (MOON-DPAP CNN), mcmahan_cnn (McMahan et al. 2017) or mlp (784-100-10)")
    clients: int = _param(20, "number of clients N")
    partition: str = _param("dirichlet", "iid, dirichlet (label skew) or shards")
    alpha: float = _param(0.5, "Dirichlet concentration (smaller = more skewed)")
    min_client_samples: int = _param(10, "Dirichlet: redraw until every client has this many")
    shards_per_client: int = _param(2, "shards partition: label-sorted shards per client")
    client_fraction: float = _param(1.0, "fraction of clients sampled each round, in (0, 1]")
    rounds: int = _param(30, "global rounds T")
    local_epochs: int = _param(1, "local epochs E per round")
    batch_size: int = _param(32, "local minibatch size B")
    lr: float = _param(0.01, "client learning rate")
    momentum: float = _param(0.9, "client SGD momentum (buffers reset every round)")
    weight_decay: float = _param(0.0, "client SGD weight decay")
    server_lr: float = _param(1.0, "server learning rate applied to the averaged update")
    dropout: float = _param(0.0, "dropout probability on the representation (cnn model)")
    precision: str = _param("float32", "training arithmetic: float32; bfloat16 (the forward pass under "
                            "torch.autocast: faster where the hardware has bf16 units, other numbers); or "
                            "float64 (model and data in double precision: the reference of numerical checks)")
    # ---- algorithm-specific (each used only by the algorithms that name it) ----------
    prox_mu: float = _param(0.01, "FedProx: weight mu of the proximal term mu/2 ||w - w_global||^2")
    feddyn_alpha: float = _param(0.01, "FedDyn: regularisation alpha")
    moon_mu: float = _param(0.01, "MOON: weight mu of the model-contrastive loss (MOON-DPAP: best 0.01)")
    moon_tau: float = _param(0.5, "MOON: temperature tau of the contrastive loss")
    projection_dim: int = _param(64, "MOON/MOON-DPAP: output size of the projection head (0 = none)")
    ditto_lambda: float = _param(0.1, "Ditto: weight lambda pulling the personal model to the global one")
    # ---- MOON-DPAP components (switches for the ablation) ---------------------------------
    cosine_lr: bool = _param(False, "cosine-annealed client lr from lr to lr_min (MOON-DPAP eq. 1)")
    lr_min: float = _param(0.0, "eta_min of the cosine schedule")
    tau_min: float = _param(0.1, "MOON-DPAP eq. 2: temperature decreases from moon_tau to tau_min")
    mu_max: float = _param(0.05, "MOON-DPAP eq. 3: contrastive weight grows from moon_mu to mu_max")
    schedule_ramp: float = _param(0.5, "fraction of rounds over which tau and mu reach their end values")
    prune: bool = _param(False, "magnitude pruning with a linearly growing threshold (eq. 6, 7)")
    prune_t_min: float = _param(0.0, "pruning threshold at round 0 (eq. 7 T_min)")
    prune_t_max: float = _param(0.01, "pruning threshold at the last round (eq. 7 T_max)")
    # ---- client-level differential privacy (MOON-DPAP; later DP-FedAvg) --------------------
    dp: str = _param("none", "none, central (server adds noise to the sum) or local (each client adds noise)")
    dp_clip: float = _param(0.5, "L2 clip norm C of each client's model update")
    secure_noise: bool = _param(True, "floating-point-safe privacy noise: values on a power-of-two grid, "
                                "exact discrete Gaussian/Laplace noise (False: float noise, open to "
                                "Mironov's attack)")
    dp_epsilon: float = _param(1.0, "per-round epsilon_0 (schedule 'paper') or total target "
                               "(schedule 'constant')")
    dp_delta: float = _param(1e-5, "delta per round (paper) / of the whole run (constant)")
    dp_schedule: str = _param("paper", "paper: epsilon(t) = epsilon_0 (1 - t/T) (eq. 5); "
                              "constant: fixed noise calibrated to a total epsilon")
    dp_eps_floor: float = _param(0.0, "paper schedule: lower bound on epsilon(t), "
                                 "as a fraction of epsilon_0")
    # ---- DP-FedAvg (McMahan et al. 2018) and adaptive clipping (Andrew et al. 2021) --------
    dp_noise_multiplier: float = _param(1.0, "DP-FedAvg: z; noise std on the sum of clipped updates = z C")
    adaptive_clip: bool = _param(False, "DP-FedAvg: adapt C to a private quantile of the update norms")
    clip_quantile: float = _param(0.5, "adaptive clipping: target fraction gamma of unclipped updates")
    clip_lr: float = _param(0.2, "adaptive clipping: geometric learning rate eta_C")
    clip_count_std: float = _param(0.0, "adaptive clipping: noise sigma_b on the unclipped count "
                                   "(0 = expected clients per round / 20)")
    # ---- local DP: LDP-FL, SignDS-FL, FDL ------------------------------------------------------
    ldp_epsilon: float = _param(0.5, "local DP: the method's own epsilon (LDP-FL: per coordinate; "
                                "SignDS-FL: per round; FDL as published: per draw and per value; "
                                "FDL corrected: per client and round in total)")
    ldp_clip: float = _param(0.001, "local DP: public per-coordinate clip c of the update "
                             "(LDP-FL's range radius r; corrected FDL's c)")
    fdl_mode: str = _param("as_published", "FDL: as_published (data-dependent normalisation and filter) "
                           "or corrected (public clip, public k, budget split)")
    fdl_r: float = _param(0.01, "FDL: magnitude threshold r (as published: hard filter |v| > r; "
                          "corrected: utility min(1, |v| / r))")
    fdl_th: float = _param(0.8, "FDL as published: th = this fraction of the filtered dimensions")
    fdl_k: int = _param(100, "FDL corrected: public number k of dimensions sent")
    fdl_selection_share: float = _param(0.5, "FDL corrected: share of epsilon spent on selecting dimensions")
    signds_k: float = _param(0.01, "SignDS-FL: top-k set size as a fraction kappa of the dimensions")
    signds_h: int = _param(100, "SignDS-FL: number h of dimensions each client reports")
    signds_threshold: float = _param(0.6, "SignDS-FL: nu_th = ceil(rho h); rho")
    signds_lr: float = _param(0.01, "SignDS-FL: global step eta_g per reported sign")
    train_samples: int = _param(0, "use a stratified subset of this many training samples (0 = all)")
    test_samples: int = _param(0, "evaluate on this many test samples (0 = all)")
    eval_every: int = _param(1, "evaluate the global model every k rounds (and at the end)")
    seed: int = _param(0, "seed for data subset, partition, init, sampling and batches")
    profile: str = _param("custom", "label of the profile that produced this config")

    # ---- derived helpers -------------------------------------------------------------
    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (unknown names raise :class:`ConfigError`)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown config field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown config field(s): {sorted(unknown)}")
        return cls(**d)

    def key(self, version: int = RESULTS_VERSION) -> str:
        """Stable hash of the fields that differ from their defaults plus :data:`RESULTS_VERSION`:
        the cache key. A new field added with a default therefore never invalidates existing
        results; *changing* a default (or any code that alters results) needs a
        :data:`RESULTS_VERSION` bump (``version``: the key under an earlier one, for migrations)."""
        defaults = _defaults()
        changed = {k: v for k, v in self.to_dict().items() if v != defaults[k]}
        payload = json.dumps({"v": version, **changed}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def n_train(self) -> int:
        full = DATASET_SIZES.get(self.dataset, (0, 0))[0]
        return self.train_samples or full

    @property
    def n_test(self) -> int:
        full = DATASET_SIZES.get(self.dataset, (0, 0))[1]
        return self.test_samples or full

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.client_fraction * self.clients))

    # ---- validation ------------------------------------------------------------------
    def validate(self) -> Config:
        """Raise :class:`ConfigError` listing every problem; return ``self`` when valid."""
        from fedlib.algorithms import ALGORITHMS  # local import: algorithms import config

        errs: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            expected = type(f.default)
            if expected is float and isinstance(v, int) and not isinstance(v, bool):
                continue
            if not isinstance(v, expected) or (expected is int and isinstance(v, bool)):
                errs.append(f"{f.name} must be {expected.__name__}, got {v!r}")
        if errs:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errs))

        if self.algorithm not in ALGORITHMS:
            errs.append(f"unknown algorithm {self.algorithm!r}; choose from {sorted(ALGORITHMS)}")
        if self.dataset not in DATASET_SIZES:
            errs.append(f"unknown dataset {self.dataset!r}; choose from {sorted(DATASET_SIZES)}")
        if self.model not in MODELS:
            errs.append(f"unknown model {self.model!r}; choose from {list(MODELS)}")
        if self.partition not in PARTITIONS:
            errs.append(f"unknown partition {self.partition!r}; choose from {list(PARTITIONS)}")
        if self.clients < 1:
            errs.append(f"clients must be >= 1, got {self.clients}")
        if self.partition == "dirichlet" and not self.alpha > 0:
            errs.append(f"alpha must be > 0 for the Dirichlet partition, got {self.alpha}")
        if self.min_client_samples < 1:
            errs.append(f"min_client_samples must be >= 1, got {self.min_client_samples}")
        if self.shards_per_client < 1:
            errs.append(f"shards_per_client must be >= 1, got {self.shards_per_client}")
        if not 0 < self.client_fraction <= 1:
            errs.append(f"client_fraction must be in (0, 1], got {self.client_fraction}")
        for name in ("rounds", "local_epochs", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                errs.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            errs.append(f"lr must be > 0, got {self.lr}")
        if not self.server_lr > 0:
            errs.append(f"server_lr must be > 0, got {self.server_lr}")
        if not 0 <= self.momentum < 1:
            errs.append(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            errs.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.dropout < 1:
            errs.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.precision not in PRECISIONS:
            errs.append(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        for name in ("prox_mu", "feddyn_alpha", "moon_mu", "ditto_lambda", "lr_min", "prune_t_min",
                     "dp_eps_floor"):
            if getattr(self, name) < 0:
                errs.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.moon_tau > 0 or not self.tau_min > 0:
            errs.append("moon_tau and tau_min must be > 0")
        if self.projection_dim < 0:
            errs.append(f"projection_dim must be >= 0, got {self.projection_dim}")
        if not 0 < self.schedule_ramp <= 1:
            errs.append(f"schedule_ramp must be in (0, 1], got {self.schedule_ramp}")
        if self.prune_t_max < self.prune_t_min:
            errs.append("prune_t_max must be >= prune_t_min")
        if self.lr_min > self.lr:
            errs.append(f"lr_min ({self.lr_min}) must not exceed lr ({self.lr})")
        if self.dp not in ("none", "central", "local"):
            errs.append(f"dp must be none, central or local, got {self.dp!r}")
        if self.dp != "none":
            if not self.dp_clip > 0:
                errs.append(f"dp_clip must be > 0, got {self.dp_clip}")
            if not self.dp_epsilon > 0:
                errs.append(f"dp_epsilon must be > 0, got {self.dp_epsilon}")
            if not 0 < self.dp_delta < 1:
                errs.append(f"dp_delta must be in (0, 1), got {self.dp_delta}")
            if self.dp_schedule not in ("paper", "constant"):
                errs.append(f"dp_schedule must be paper or constant, got {self.dp_schedule!r}")
        if self.algorithm in ("ldp_fl", "signds_fl", "fdl"):
            if not self.ldp_epsilon > 0 or not self.ldp_clip > 0:
                errs.append("local DP needs ldp_epsilon > 0 and ldp_clip > 0")
            if self.fdl_mode not in ("as_published", "corrected"):
                errs.append(f"fdl_mode must be as_published or corrected, got {self.fdl_mode!r}")
            if not self.fdl_r >= 0 or not 0 < self.fdl_th <= 1 or self.fdl_k < 1:
                errs.append("FDL needs fdl_r >= 0, 0 < fdl_th <= 1, fdl_k >= 1")
            if not 0 < self.fdl_selection_share < 1:
                errs.append(f"fdl_selection_share must be in (0, 1), got {self.fdl_selection_share}")
            if (not 0 < self.signds_k <= 0.25 or self.signds_h < 1
                    or not 0.5 <= self.signds_threshold <= 1):
                errs.append("SignDS-FL needs 0 < signds_k <= 0.25, signds_h >= 1, "
                            "0.5 <= signds_threshold <= 1")
            if not self.signds_lr > 0:
                errs.append(f"signds_lr must be > 0, got {self.signds_lr}")
        if self.algorithm == "dp_fedavg":
            if not self.dp_clip > 0 or not 0 < self.dp_delta < 1 or self.dp_noise_multiplier < 0:
                errs.append("DP-FedAvg needs dp_clip > 0, 0 < dp_delta < 1, dp_noise_multiplier >= 0")
            if not 0 < self.clip_quantile < 1 or not self.clip_lr > 0 or self.clip_count_std < 0:
                errs.append("adaptive clipping needs 0 < clip_quantile < 1, clip_lr > 0, clip_count_std >= 0")
            sigma_b = self.clip_count_std or self.client_fraction * self.clients / 20
            z = self.dp_noise_multiplier
            if self.adaptive_clip and z > 0 and not z < 2 * sigma_b:
                errs.append(f"adaptive clipping needs dp_noise_multiplier < 2 clip_count_std = "
                            f"{2 * sigma_b:.3g} (Andrew et al. 2021, Thm 1); raise clip_count_std")
        if self.seed < 0:
            errs.append(f"seed must be >= 0, got {self.seed}")
        if self.dataset in DATASET_SIZES:
            full_train, full_test = DATASET_SIZES[self.dataset]
            if not 0 <= self.train_samples <= full_train:
                errs.append(f"train_samples must be in [0, {full_train}], got {self.train_samples}")
            if not 0 <= self.test_samples <= full_test:
                errs.append(f"test_samples must be in [0, {full_test}], got {self.test_samples}")
            if self.clients > self.n_train:
                errs.append(f"more clients ({self.clients}) than training samples ({self.n_train})")
            elif self.partition == "dirichlet" and self.clients * self.min_client_samples > self.n_train:
                errs.append(
                    f"{self.clients} clients x min_client_samples {self.min_client_samples} "
                    f"exceeds the {self.n_train} training samples"
                )
            elif self.partition == "shards" and self.clients * self.shards_per_client > self.n_train:
                errs.append("more shards than training samples")
        if self.profile not in (*PROFILES, "custom"):
            errs.append(f"unknown profile {self.profile!r}; choose from {[*PROFILES, 'custom']}")
        if errs:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errs))
        return self


def _defaults() -> dict[str, Any]:
    return Config().to_dict()


# ---- profiles ------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """How far a paper-scale config is shrunk. ``0`` means 'keep the paper's value'."""

    name: str
    description: str
    train_samples: int = 0
    test_samples: int = 0
    max_rounds: int = 0
    max_clients: int = 0
    seeds: int = 1
    eval_every: int = 1

    def apply(self, config: Config) -> Config:
        """Shrink ``config`` (a paper-scale experiment) to this profile."""
        changes: dict[str, Any] = {"profile": self.name}
        if self.train_samples and (not config.train_samples or config.train_samples > self.train_samples):
            changes["train_samples"] = self.train_samples
        if self.test_samples and (not config.test_samples or config.test_samples > self.test_samples):
            changes["test_samples"] = self.test_samples
        if self.max_rounds and config.rounds > self.max_rounds:
            changes["rounds"] = self.max_rounds
        if self.max_clients and config.clients > self.max_clients:
            changes["clients"] = self.max_clients
        if self.eval_every > 1:
            changes["eval_every"] = self.eval_every
        return config.replace(**changes)


PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        "smoke", "seconds; for tests: 600 training samples, 2 rounds, 4 clients at most",
        train_samples=600, test_samples=300, max_rounds=2, max_clients=4, seeds=1,
    ),
    "quick": Profile(
        "quick", "minutes on a 2-core CPU: 4,000 training samples, 2,000 test samples, 20 rounds at most, "
        "3 seeds", train_samples=4_000, test_samples=2_000, max_rounds=20, seeds=3,
    ),
    "paper": Profile("paper", "the papers' own settings (full data and rounds); meant for a GPU", seeds=3),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose from {list(PROFILES)}") from None
