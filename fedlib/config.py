"""Experiment configuration and its validation.

A :class:`Config` says *what* is computed; it fully determines a result (together with
the code version), so its hash keys the results cache (:mod:`fedlib.results`). *How* it
is executed (engine path, device, checkpoint interval) is passed separately to
:func:`fedlib.run` and does not change the result beyond floating-point rounding.

The fields are flat (one command-line option each, one stable hash), grouped by who reads
them: the generic fields every run has, and each algorithm's own hyperparameters, marked
with their owner (``owner`` metadata). An algorithm declares the fields it reads
(``Algorithm.fields``) and checks them itself (``Algorithm.check``); :meth:`Config.validate`
runs the generic rules and then the check registered for ``algorithm`` (algorithms register
when :mod:`fedlib.algorithms` is imported, so this module imports none of them). Every field
has one meaning, and privacy budgets name their unit (per round, per coordinate, per draw,
total).

Scaling a paper's setting down to a machine (profiles ``smoke``, ``quick``, ``paper``) is the
studies' business (:mod:`studies.common`); ``profile`` here only labels the result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Bump when a change to the code alters results, so that old cache entries are not reused;
#: results that the change leaves as they were are carried over by ``python -m lab.migrate``
#: (one rule per version there). 2: privacy noise is floating-point safe, keyed on the whole
#: config; MOON-DPAP's central noise follows replace-one (sensitivity 2C). 3: privacy budgets
#: renamed to one meaning each (``dp_epsilon``, ``ldp_epsilon`` split by unit; results unchanged).
#: 4: local randomisers run in each client with generators keyed per client (LDP-FL, SignDS-FL,
#: FDL draw anew; MOON-DPAP's local noise was already keyed per client), and DP-FedAvg's Poisson
#: sample is keyed on the whole config. 5: a non-finite update (or per-sample gradient) is zeroed
#: before it is clipped or randomised (only runs with a privacy mechanism whose losses diverged change).
RESULTS_VERSION = 5

#: The results version whose cache key also keys every privacy-noise and client-sampling stream
#: (:meth:`Config.noise_key`). Frozen, never bumped: a :data:`RESULTS_VERSION` bump must not
#: re-key the noise of results it carries over, or a kept result could no longer be reproduced
#: from its config. (Versions 2 and 3 keyed noise on the current cache key; version 4's migration
#: recomputes the noisy results that an earlier bump had carried over for that reason.)
NOISE_KEY_VERSION = 3

DATASET_SIZES = {"fashionmnist": (60_000, 10_000), "mnist": (60_000, 10_000)}
MODELS = ("cnn", "mcmahan_cnn", "mlp")
PARTITIONS = ("iid", "dirichlet", "shards")
PRECISIONS = ("float32", "bfloat16", "float64")


class ConfigError(ValueError):
    """A configuration that cannot be run; raised before any work starts."""

    def one_line(self) -> str:
        """The message on one line (problems separated by ``;``), for a command line."""
        lines = [x.strip() for x in str(self).splitlines() if x.strip()]
        if len(lines) > 1 and lines[0].endswith(":"):
            return f"{lines[0]} {'; '.join(lines[1:])}"
        return "; ".join(lines)


#: Labels a config's ``profile`` may carry (see :mod:`studies.common` for what they mean).
PROFILE_NAMES = ("smoke", "quick", "paper", "custom")

#: algorithm name -> its check (``list`` of problems); filled by :mod:`fedlib.algorithms`.
_ALGORITHM_CHECKS: dict[str, Callable[[Config], list[str]]] = {}
#: algorithm name -> the algorithm-specific fields it reads (its ``Algorithm.fields``).
_ALGORITHM_FIELDS: dict[str, tuple[str, ...]] = {}


def register_algorithm(name: str, check: Callable[[Config], list[str]], fields: tuple[str, ...] = ()) -> None:
    """Make ``name`` a valid ``Config.algorithm`` whose fields ``check`` validates; ``fields``: the
    algorithm-specific fields it reads, which a config of it may then set (an algorithm written outside
    fedlib that extends one of fedlib's reads its fields: :func:`fedlib.algorithms.register`)."""
    _ALGORITHM_CHECKS[name] = check
    _ALGORITHM_FIELDS[name] = tuple(fields)


def algorithm_names() -> list[str]:
    """The names a :class:`Config` accepts as ``algorithm`` (those registered)."""
    return sorted(_ALGORITHM_CHECKS)


def _param(default: Any, help: str, owner: str = "") -> Any:
    """A field with its help text and, for algorithm-specific fields, the algorithm(s) that read
    it (comma-separated)."""
    return field(default=default, metadata={"help": help, "owner": owner})


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
    train_rounds: int = _param(0, "train only the first this many rounds of the T-round run (0 = all T): "
                               "every schedule, noise calibration and draw is the T-round run's, so the "
                               "result is that run's prefix (tuning at the horizon a run has)")
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
    # ---- algorithm-specific: each field names the algorithm(s) that read it ---------------
    prox_mu: float = _param(0.01,
                            "FedProx: weight mu of the proximal term mu/2 ||w - w_global||^2", "fedprox")
    feddyn_alpha: float = _param(0.01, "FedDyn: regularisation alpha", "feddyn")
    moon_mu: float = _param(0.01,
                            "MOON: weight mu of the model-contrastive loss (MOON-DPAP: its start, eq. 3)",
                            "moon,moon_dpap")
    moon_tau: float = _param(0.5,
                             "MOON: temperature tau of the contrastive loss (MOON-DPAP: its start, eq. 2)",
                             "moon,moon_dpap")
    projection_dim: int = _param(64, "MOON/MOON-DPAP: output size of the projection head (0 = none)",
                                 "moon,moon_dpap")
    ditto_lambda: float = _param(0.1,
                                 "Ditto: weight lambda pulling the personal model to the global one", "ditto")
    # ---- MOON-DPAP components (switches for the ablation) ---------------------------------
    cosine_lr: bool = _param(False,
                             "MOON-DPAP eq. 1: cosine-annealed client lr from lr to lr_min", "moon_dpap")
    lr_min: float = _param(0.0, "MOON-DPAP eq. 1: eta_min of the cosine schedule", "moon_dpap")
    tau_min: float = _param(0.1,
                            "MOON-DPAP eq. 2: temperature decreases from moon_tau to tau_min", "moon_dpap")
    mu_max: float = _param(0.05,
                           "MOON-DPAP eq. 3: contrastive weight grows from moon_mu to mu_max", "moon_dpap")
    schedule_ramp: float = _param(0.5, "MOON-DPAP: fraction of rounds over which tau and mu reach their end "
                                  "values", "moon_dpap")
    prune: bool = _param(False, "MOON-DPAP eq. 6-7: magnitude pruning with a linearly growing threshold",
                         "moon_dpap")
    prune_t_min: float = _param(0.0, "MOON-DPAP eq. 7: pruning threshold T_min at round 0", "moon_dpap")
    prune_t_max: float = _param(0.01,
                                "MOON-DPAP eq. 7: pruning threshold T_max at the last round", "moon_dpap")
    dp: str = _param("none", "MOON-DPAP DP: none; client-level central (the server adds noise to the sum) or "
                     "local (each client adds noise); or record (record-level DP-SGD in each client)",
                     "moon_dpap")
    dp_epsilon_per_round: float = _param(1.0,
                                         "MOON-DPAP schedule 'paper': epsilon_0 of eq. 5, the epsilon of "
                                         "round 0 (round t gets epsilon_0 (1 - t/T))", "moon_dpap")
    dp_epsilon_total: float = _param(1.0, "MOON-DPAP schedule 'constant': the epsilon the whole run spends",
                                     "moon_dpap")
    dp_schedule: str = _param("paper",
                              "MOON-DPAP: paper (eq. 5, dp_epsilon_per_round) or constant (one noise "
                              "level calibrated to dp_epsilon_total)", "moon_dpap")
    dp_grad: str = _param("per_sample",
                          "MOON-DPAP dp = record: how each step's sum of clipped per-sample gradients is "
                          "computed: per_sample (every per-sample gradient materialised, vmap of grad) or "
                          "ghost (norms of the linear layers from their inputs and output gradients, "
                          "fedlib.privacy.ghost: the same sum, other rounding, ~6x faster on the CNN)",
                          "moon_dpap")
    dp_sigma: str = _param("one",
                           "MOON-DPAP dp = record: one noise multiplier for every client, calibrated to "
                           "the least protected client (one), or each client's own, calibrated to its own "
                           "sampling rate and steps for the same dp_epsilon_total (per_client; disjoint "
                           "data compose in parallel)", "moon_dpap")
    dp_noise_free: bool = _param(False, "MOON-DPAP dp = formula: the control without noise (the same "
                                 "per-sample clipping and path, no noise added): what the clip alone costs",
                                 "moon_dpap")
    dp_eps_floor: float = _param(0.0,
                                 "MOON-DPAP schedule 'paper': lower bound on epsilon(t), as a fraction of "
                                 "epsilon_0", "moon_dpap")
    # ---- shared by the central-DP algorithms ----------------------------------------------
    dp_clip: float = _param(0.5, "L2 clip norm C of each client's model update (dp = record: of each "
                            "per-sample gradient; DP-FedAvg: the initial C under adaptive clipping)",
                            "moon_dpap,dp_fedavg")
    dp_delta: float = _param(1e-5, "delta of the run's (epsilon, delta) guarantee (MOON-DPAP's eq. 5 also "
                             "calibrates each round at it)", "moon_dpap,dp_fedavg")
    secure_noise: bool = _param(True, "floating-point-safe privacy noise: values on a power-of-two grid, "
                                "exact discrete Gaussian/Laplace noise (False: float noise, open to "
                                "Mironov's attack)", "moon_dpap,dp_fedavg,fdl")
    randomness: str = _param("seeded", "privacy noise and private client sampling: seeded (generators keyed "
                             "on the config, round and client: a simulation reproduces exactly) or secret "
                             "(OS entropy at every draw, nothing written regenerates them: a deployment)",
                             "moon_dpap,dp_fedavg,ldp_fl,signds_fl,fdl")
    # ---- DP-FedAvg (McMahan et al. 2018) and adaptive clipping (Andrew et al. 2021) --------
    dp_noise_multiplier: float = _param(1.0, "DP-FedAvg: z; noise std on the sum of clipped updates = z C",
                                        "dp_fedavg")
    adaptive_clip: bool = _param(False, "DP-FedAvg: adapt C to a private quantile of the update norms",
                                 "dp_fedavg")
    clip_quantile: float = _param(0.5, "adaptive clipping: target fraction gamma of unclipped updates",
                                  "dp_fedavg")
    clip_lr: float = _param(0.2, "adaptive clipping: geometric learning rate eta_C", "dp_fedavg")
    clip_count_std: float = _param(0.0, "adaptive clipping: noise sigma_b on the unclipped count "
                                   "(0 = expected clients per round / 20)", "dp_fedavg")
    # ---- local DP: LDP-FL, SignDS-FL, FDL ------------------------------------------------------
    ldp_fl_epsilon_per_coordinate: float = _param(0.5, "LDP-FL: epsilon of each coordinate's two-point "
                                                  "mechanism (a client's update: d times it)", "ldp_fl")
    signds_epsilon_per_round: float = _param(0.5, "SignDS-FL: epsilon of a client's message in one round",
                                             "signds_fl")
    fdl_epsilon_per_draw: float = _param(0.5, "FDL as published: the paper's epsilon, spent by each "
                                         "exponential draw and each Laplace value", "fdl")
    fdl_epsilon_per_round: float = _param(0.5, "FDL corrected: epsilon of a client's whole message in one "
                                          "round (selection and values)", "fdl")
    ldp_clip: float = _param(0.001, "local DP: public per-coordinate clip c of the update "
                             "(LDP-FL's range radius r; corrected FDL's c)", "ldp_fl,fdl")
    fdl_mode: str = _param("as_published", "FDL: as_published (data-dependent normalisation and filter) "
                           "or corrected (public clip, public k, budget split)", "fdl")
    fdl_r: float = _param(0.01, "FDL: magnitude threshold r (as published: hard filter |v| > r; "
                          "corrected: utility min(1, |v| / r))", "fdl")
    fdl_th: float = _param(0.8, "FDL as published: th = this fraction of the filtered dimensions", "fdl")
    fdl_k: int = _param(100, "FDL corrected: public number k of dimensions sent", "fdl")
    fdl_selection_share: float = _param(0.5, "FDL corrected: share of epsilon spent on selecting dimensions",
                                        "fdl")
    fdl_noise_free: bool = _param(False, "FDL corrected: the control without noise (the same clip, encoding "
                                  "and k; the k highest utilities, ties drawn uniformly): epsilon "
                                  "infinite, no privacy", "fdl")
    fdl_server_rescale: bool = _param(False, "FDL corrected: the server scales the mean of the sparse "
                                      "reports by d / k (an unbiased estimate of the mean clipped update "
                                      "when the k dimensions are drawn uniformly; noise scaled with it)",
                                      "fdl")
    signds_k: float = _param(0.01, "SignDS-FL: top-k set size as a fraction kappa of the dimensions",
                             "signds_fl")
    signds_h: int = _param(100, "SignDS-FL: number h of dimensions each client reports", "signds_fl")
    signds_threshold: float = _param(0.6, "SignDS-FL: nu_th = ceil(rho h); rho", "signds_fl")
    signds_lr: float = _param(0.01, "SignDS-FL: global step eta_g per reported sign", "signds_fl")
    # ---- data and evaluation ----------------------------------------------------------------
    train_samples: int = _param(0, "use a stratified subset of this many training samples (0 = all)")
    test_samples: int = _param(0, "evaluate on this many test samples (0 = all)")
    validation_samples: int = _param(0, "hold out this many of the training samples (stratified) as a "
                                     "validation set and evaluate on it instead of the test set, which "
                                     "the run then never reads (tuning; 0 = train on all, evaluate on test)")
    eval_every: int = _param(1, "evaluate the global model every k rounds (and at the end)")
    seed: int = _param(0, "seed for data subset, partition, init, sampling and batches")
    profile: str = _param("custom", "label of the profile that produced this config")

    # ---- derived quantities ------------------------------------------------------------
    @property
    def n_train(self) -> int:
        """The samples the clients train on (a validation hold-out comes out of the training set)."""
        full = DATASET_SIZES.get(self.dataset, (0, 0))[0]
        return (self.train_samples or full) - self.validation_samples

    @property
    def n_test(self) -> int:
        """The samples each evaluation reads (the validation set when there is one)."""
        full = DATASET_SIZES.get(self.dataset, (0, 0))[1]
        return self.validation_samples or self.test_samples or full

    @property
    def rounds_run(self) -> int:
        """The rounds this run trains and records: ``train_rounds`` of the ``rounds``-round schedule,
        or all of them."""
        return self.train_rounds or self.rounds

    @property
    def clients_per_round(self) -> int:
        """The clients sampled in a round: ``round(client_fraction * clients)``, at least one."""
        return max(1, round(self.client_fraction * self.clients))

    # ---- validation: types, then the generic rules, then the algorithm's own check -------
    def validate(self) -> Config:
        """Raise :class:`ConfigError` listing every problem; return ``self`` when valid: the field
        types (:func:`_type_problems`), each field alone (:func:`_field_problems`), the generic rules
        (:func:`_generic_problems`), then the check
        of the config's algorithm (``Algorithm.check``)."""
        for problems in (_type_problems, _field_problems, _generic_problems):
            errs = problems(self)
            if errs:
                raise ConfigError("invalid config:\n  " + "\n  ".join(errs))
        return self

    # ---- identity: the cache key and the noise key ---------------------------------------
    def key(self, version: int = RESULTS_VERSION) -> str:
        """Stable hash of the fields that differ from their defaults plus :data:`RESULTS_VERSION`:
        the cache key. A new field added with a default therefore never invalidates existing
        results; *changing* a default (or any code that alters results) needs a
        :data:`RESULTS_VERSION` bump (``version``: the key under an earlier one, for migrations)."""
        defaults = _defaults()
        changed = {k: v for k, v in self.to_dict().items() if v != defaults[k]}
        payload = json.dumps({"v": version, **changed}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def noise_key(self) -> str:
        """The hash that keys this config's privacy noise and sampling: :meth:`key` under the frozen
        :data:`NOISE_KEY_VERSION`, so it changes with every setting (two configs never share noise)
        but not with a results-version bump. ``dp_grad`` is left out: it says how the same clipped sum
        is computed, so a ghost-clipped run draws the per-sample run's noise and batches (and trains
        its model, to rounding). ``train_rounds`` is left out too: a run stopped early draws the noise and
        samples of the whole run it is the prefix of."""
        d = _defaults()
        plain = self.replace(dp_grad=d["dp_grad"], train_rounds=d["train_rounds"])
        return plain.key(version=NOISE_KEY_VERSION)

    # ---- serialisation and copies ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data (what a result file records)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """A config from :meth:`to_dict`'s data; an unknown field is a :class:`ConfigError`."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown config field(s): {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (unknown names raise :class:`ConfigError`)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown config field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


def _type_problems(c: Config) -> list[str]:
    """Every field of its declared type (an int where a float is declared is fine), every float
    finite (no field means anything at NaN or infinity)."""
    errs: list[str] = []
    for f in dataclasses.fields(c):
        v = getattr(c, f.name)
        expected = type(f.default)
        if expected is float and isinstance(v, int) and not isinstance(v, bool):
            continue
        if not isinstance(v, expected) or (expected is int and isinstance(v, bool)):
            errs.append(f"{f.name} must be {expected.__name__}, got {v!r}")
        elif isinstance(v, float) and not math.isfinite(v):
            errs.append(f"{f.name} must be a finite number, got {v}")
    return errs


#: The largest integer a field may hold: what a C ``long long`` holds (seeds reach PyTorch's and NumPy's
#: generators as one; a 20-digit seed overflowed there, issue 78).
INT_MAX = 2**63 - 1
#: The largest (epsilon, delta) budget of a Gaussian mechanism's calibration: far beyond any meaningful
#: guarantee (the study's frontiers stop at 1,000), where the calibrations still converge (tested).
MAX_GAUSSIAN_EPSILON = 1e4
#: The largest epsilon of a local randomiser: where its computation still holds (tested). LDP-FL's two
#: values ``(e^eps + 1) / (e^eps - 1)`` overflow a float near 709 (``MAX_LDP_FL_EPSILON``); SignDS-FL's
#: and FDL's mechanisms work in log-probabilities and noise scales ``1 / eps``, so a huge epsilon (a
#: mechanism made the identity, as a control) works up to this.
MAX_LOCAL_EPSILON = 1e16
#: LDP-FL's largest epsilon per coordinate: its two values stay finite below ~709.
MAX_LDP_FL_EPSILON = 700.0
#: The largest clip norm: 1e9 is DP-FedAvg's "no clipping" in the study; float32 squares of 1e12 still fit.
MAX_CLIP = 1e12


def _between(low: float, high: float, low_open: bool = True, high_open: bool = False):
    def test(v) -> bool:
        return (low < v if low_open else low <= v) and (v < high if high_open else v <= high)
    return test


#: Every numeric field's own range, checked in every mode before anything else (issue 78): a value no
#: mechanism could accept is refused even where the mode set does not read it (``--dp none`` with
#: ``--dp-delta 5``), and the extremes where a computation would fail are refused by name, not by the
#: library that fails on them. Cross-field rules (``lr_min <= lr``, sizes within the data) stay below.
#: Each entry: (test, what the field must be).
#:
#: :meta hide-value:
FIELD_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": (_between(0, INT_MAX, low_open=False), f"an integer in [0, {INT_MAX}]"),
    **{name: (_between(1, INT_MAX, low_open=False), f"an integer in [1, {INT_MAX}]") for name in (
        "clients", "min_client_samples", "shards_per_client", "rounds", "local_epochs", "batch_size",
        "eval_every", "fdl_k", "signds_h")},
    **{name: (_between(0, INT_MAX, low_open=False), f"an integer in [0, {INT_MAX}]") for name in (
        "train_rounds", "train_samples", "test_samples", "validation_samples", "projection_dim")},
    **{name: (lambda v: v >= 0, ">= 0") for name in (
        "weight_decay", "prox_mu", "feddyn_alpha", "moon_mu", "ditto_lambda", "lr_min", "mu_max",
        "prune_t_min", "prune_t_max", "clip_count_std", "fdl_r")},
    **{name: (lambda v: v > 0, "> 0") for name in (
        "alpha", "lr", "server_lr", "moon_tau", "tau_min", "clip_lr", "signds_lr")},
    "schedule_ramp": (_between(0, 1), "in (0, 1]"),
    "dp_eps_floor": (_between(0, 1, low_open=False), "in [0, 1] (a fraction of epsilon_0)"),
    **{name: (_between(0, MAX_GAUSSIAN_EPSILON), f"in (0, {MAX_GAUSSIAN_EPSILON:g}]") for name in (
        "dp_epsilon_per_round", "dp_epsilon_total")},
    **{name: (_between(0, MAX_LOCAL_EPSILON), f"in (0, {MAX_LOCAL_EPSILON:g}]") for name in (
        "signds_epsilon_per_round", "fdl_epsilon_per_draw", "fdl_epsilon_per_round")},
    "ldp_fl_epsilon_per_coordinate": (_between(0, MAX_LDP_FL_EPSILON), f"in (0, {MAX_LDP_FL_EPSILON:g}]"),
    **{name: (_between(0, MAX_CLIP), f"in (0, {MAX_CLIP:g}]") for name in ("dp_clip", "ldp_clip")},
    "dp_delta": (_between(0, 1, high_open=True), "in (0, 1)"),
    "dp_noise_multiplier": (_between(0, 1e6, low_open=False), "in [0, 1e6]"),
    "clip_quantile": (_between(0, 1, high_open=True), "in (0, 1)"),
    "fdl_th": (_between(0, 1), "in (0, 1]"),
    "fdl_selection_share": (_between(0, 1, high_open=True), "in (0, 1)"),
    "signds_k": (_between(0, 0.25), "in (0, 0.25]"),
    "signds_threshold": (_between(0.5, 1, low_open=False), "in [0.5, 1]"),
}
#: Fields with a fixed set of values, checked in every mode too.
#:
#: :meta hide-value:
FIELD_CHOICES = {"dp_schedule": ("paper", "constant"), "dp_grad": ("per_sample", "ghost"),
                 "dp_sigma": ("one", "per_client"),
                 "fdl_mode": ("as_published", "corrected")}


def _range_problems(c: Config) -> list[str]:
    """Each field within its own range (:data:`FIELD_RANGES`, :data:`FIELD_CHOICES`), whatever the mode:
    one line per field, naming it."""
    errs = []
    for name, (test, text) in FIELD_RANGES.items():
        v = getattr(c, name)
        if not test(v):
            errs.append(f"{name} must be {text}, got {v!r}")
    for name, allowed in FIELD_CHOICES.items():
        if getattr(c, name) not in allowed:
            errs.append(f"{name} must be one of {', '.join(allowed)}, got {getattr(c, name)!r}")
    return errs


def _field_problems(c: Config) -> list[str]:
    """Each field on its own: within its range, and read by the algorithm when set
    (:func:`ownership_problems`); checked before the rules that combine fields."""
    return _range_problems(c) + ownership_problems(c)


def _generic_problems(c: Config) -> list[str]:
    """The rules every run shares, then the check registered for ``c.algorithm``."""
    errs: list[str] = []
    choices = (("algorithm", algorithm_names()), ("dataset", sorted(DATASET_SIZES)), ("model", list(MODELS)),
               ("partition", list(PARTITIONS)), ("profile", list(PROFILE_NAMES)))
    for name, allowed in choices:
        if getattr(c, name) not in allowed:
            errs.append(f"unknown {name} {getattr(c, name)!r}; choose from {allowed}")
    if c.clients < 1:
        errs.append(f"clients must be >= 1, got {c.clients}")
    if c.partition == "dirichlet" and not c.alpha > 0:
        errs.append(f"alpha must be > 0 for the Dirichlet partition, got {c.alpha}")
    for name in ("min_client_samples", "shards_per_client", "rounds", "local_epochs", "batch_size",
                 "eval_every"):
        if getattr(c, name) < 1:
            errs.append(f"{name} must be >= 1, got {getattr(c, name)}")
    if not 0 <= c.train_rounds <= c.rounds:
        errs.append(f"train_rounds must be in [0, rounds = {c.rounds}] (0 = all rounds), got "
                    f"{c.train_rounds}")
    if not 0 < c.client_fraction <= 1:
        errs.append(f"client_fraction must be in (0, 1], got {c.client_fraction}")
    for name in ("lr", "server_lr"):
        if not getattr(c, name) > 0:
            errs.append(f"{name} must be > 0, got {getattr(c, name)}")
    for name in ("momentum", "dropout"):
        if not 0 <= getattr(c, name) < 1:
            errs.append(f"{name} must be in [0, 1), got {getattr(c, name)}")
    for name in ("weight_decay", "seed"):
        if getattr(c, name) < 0:
            errs.append(f"{name} must be >= 0, got {getattr(c, name)}")
    if c.precision not in PRECISIONS:
        errs.append(f"precision must be one of {list(PRECISIONS)}, got {c.precision!r}")
    if c.randomness not in ("seeded", "secret"):
        errs.append(f"randomness must be seeded or secret, got {c.randomness!r}")
    errs.extend(_size_problems(c))
    if c.algorithm in _ALGORITHM_CHECKS:
        errs.extend(_ALGORITHM_CHECKS[c.algorithm](c))
    return errs


def owners_of(name: str) -> list[str]:
    """The algorithms that read field ``name`` (its ``owner`` metadata, and every registered algorithm
    that declares it among its fields); empty for a field every run reads."""
    owner = next(f for f in dataclasses.fields(Config) if f.name == name).metadata.get("owner", "")
    owners = [a for a in owner.split(",") if a]
    if not owners:
        return []
    return owners + [a for a, fs in _ALGORITHM_FIELDS.items() if name in fs and a not in owners]


def ownership_problems(c: Config) -> list[str]:
    """A field set away from its default that ``c.algorithm`` does not read: asked for, silently
    ignored (``--algorithm fedavg --dp record`` would train without any privacy). Refused, naming the
    field and the algorithms that read it (issue 65)."""
    errs = []
    defaults = _defaults()
    for f in dataclasses.fields(c):
        owners = owners_of(f.name)
        if owners and c.algorithm not in owners and getattr(c, f.name) != defaults[f.name]:
            errs.append(f"{f.name} = {getattr(c, f.name)!r} is a setting of {', '.join(owners)}; "
                        f"{c.algorithm} does not read it (remove it, or choose one of those algorithms)")
    return errs


def _size_problems(c: Config) -> list[str]:
    """Subset sizes within the data set, and enough samples for the clients."""
    if c.dataset not in DATASET_SIZES:
        return []
    errs: list[str] = []
    full_train, full_test = DATASET_SIZES[c.dataset]
    if not 0 <= c.train_samples <= full_train:
        errs.append(f"train_samples must be in [0, {full_train}], got {c.train_samples}")
    if not 0 <= c.test_samples <= full_test:
        errs.append(f"test_samples must be in [0, {full_test}], got {c.test_samples}")
    if not 0 <= c.validation_samples < (c.train_samples or full_train):
        errs.append(f"validation_samples must be in [0, {c.train_samples or full_train}), got "
                    f"{c.validation_samples}")
    elif c.validation_samples and c.test_samples:
        errs.append("validation_samples evaluates on a hold-out of the training set and never reads the "
                    "test set: test_samples must stay 0")
    if c.clients > c.n_train:
        errs.append(f"more clients ({c.clients}) than training samples ({c.n_train})")
    elif c.partition == "dirichlet" and c.clients * c.min_client_samples > c.n_train:
        errs.append(f"{c.clients} clients x min_client_samples {c.min_client_samples} "
                    f"exceeds the {c.n_train} training samples")
    elif c.partition == "shards" and c.clients * c.shards_per_client > c.n_train:
        errs.append("more shards than training samples")
    return errs


def _defaults() -> dict[str, Any]:
    return Config().to_dict()
