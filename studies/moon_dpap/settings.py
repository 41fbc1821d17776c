"""MOON-DPAP (Su, ICDSE 2025): the paper's setting, our choices where it is silent, its
published numbers (reference data, never results) and how each profile scales the setting."""

from __future__ import annotations

from fedlib.config import Config
from studies.claims import Reading
from studies.common import Scale, scale_of

#: The paper's setting (Sec. 4.1) plus our choices where it is silent (see CHOICES).
PAPER_SETTING = Config(
    algorithm="fedavg",
    dataset="fashionmnist",
    model="cnn",
    clients=20,
    partition="dirichlet",
    alpha=0.5,
    client_fraction=1.0,
    rounds=200,
    local_epochs=1,
    batch_size=32,
    lr=0.005,
    momentum=0.0,
    weight_decay=0.0,
    moon_mu=0.01,
)

#: Settings the paper gives (field: where).
GIVEN = {
    "dataset": "Sec. 4.1",
    "model": "Sec. 4.1 (layer types only)",
    "clients": "Sec. 4.1",
    "partition": "Sec. 4.1 (Dirichlet; alpha not given)",
    "client_fraction": "Sec. 4.1",
    "rounds": "Sec. 4.1",
    "local_epochs": "Sec. 4.1",
    "batch_size": "Sec. 4.1",
    "lr": "Sec. 4.1",
    "moon_mu": "Sec. 4.2 (best mu)",
}

#: MOON-DPAP with every component on (the values the paper does not give are ours).
FULL_DPAP = dict(
    algorithm="moon_dpap",
    cosine_lr=True,
    lr_min=0.0005,
    dropout=0.2,
    prune=True,
    prune_t_min=0.0,
    prune_t_max=0.005,
    moon_tau=0.5,
    tau_min=0.1,
    moon_mu=0.01,
    mu_max=0.05,
    schedule_ramp=0.5,
)

#: Every setting the paper leaves unspecified: (field, value chosen, why).
CHOICES = [
    ("alpha (Dirichlet)", 0.5, "NIID-Bench's default; the paper says only 'Dirichlet non-IID'"),
    ("momentum", 0.0, "the paper says 'SGD, lr 0.005'; plain SGD as in PFLlib, which its setup matches"),
    ("CNN widths", "conv 16, 32; FC 128", "the paper gives layer types, not widths"),
    ("projection head", "MLP 128-128-64", "MOON's design (Li et al. 2021); not described in the paper"),
    ("tau: tau_max -> tau_min", "0.5 -> 0.1", "MOON's default temperature as the start"),
    ("mu: mu_min -> mu_max", "0.01 -> 0.05", "the paper's best mu = 0.01 as the start"),
    ("alpha, beta of eq. 2-3", "reach the end values at T/2", "not given"),
    ("eta_min of eq. 1", 0.0005, "one tenth of eta_max = 0.005"),
    ("dropout", 0.2, "probability not given; on the representation"),
    ("T_min, T_max of eq. 7", "0 -> 0.005", "about a third of the initial |w| scale of the FC layer"),
    ("DP: where the noise goes", "client-level, clipped update, central", "'to the gradient update process'"),
    (
        "DP: neighbouring relation",
        "replace one client (sensitivity 2C)",
        "not given; the server divides by the public number of clients",
    ),
    ("DP: clip norm C", 0.5, "not given (Delta_f); sensitivity shown in the frontier notebook"),
    ("DP: delta", 1e-5, "not given; << 1 / number of clients"),
    ("DP: epsilon_0", 1.0, "not given"),
    (
        "DP: aggregation",
        "client-level DP: unweighted mean over the 20 clients; record-level and the formula in "
        "circulation: sample-weighted, as without DP",
        "a sample-weighted mean's sensitivity would depend on the private client sizes; record-level "
        "noise is added inside each client, so the server's weights are post-processing",
    ),
    (
        "DP: record-level learning rate and clip",
        "tuned on a validation split (the record-level tuning grid on the Fig. 2 page)",
        "lr 0.005 with per-sample gradients clipped to C = 1 barely trains in the quick runs",
    ),
    (
        "DP: the formula in circulation",
        "per-sample clip C = 10, eq. 4 noise with Delta_f = 2 lr C / n_i on each client's update, eq. 5 "
        "schedule, epsilon_0 = 1",
        "what widely copied implementations of these equations do (their default clip is 10); no valid "
        "guarantee",
    ),
]

#: Published numbers (accuracy in %, loss).
PAPER = {
    "fig1": {"moon_dpap": (83.6, 0.44), "fedavg_gap": 4.7},
    "fig2": {"dp": (77.0, 0.71)},
    "table1": {  # algorithm: (acc 10 clients, loss 10, acc 20 clients, loss 20)
        "fedavg": (53.37, 1.22, 48.85, 1.34),
        "feddyn": (47.97, 1.64, 43.38, 1.83),
        "scaffold": (43.37, 1.51, 40.37, 1.57),
        "moon": (53.65, 1.21, 49.17, 1.34),
        "moon_dpap": (62.34, 1.13, 58.60, 1.26),
    },
    "table2": {
        "full": (83.71, 0.44),
        "no_dynamic_lr": (81.03, 0.52),
        "no_dropout": (80.98, 0.48),
        "no_pruning": (82.94, 0.47),
        "no_all_three": (78.77, 0.53),
    },
}

#: Record-level DP-SGD tuned for clipped gradients (issue 63): a grid of (lr, C) at a reduced scale,
#: each run trained on the quick profile's training images less a stratified validation hold-out and
#: evaluated on that hold-out only (the test set is never read), at the total epsilon the page states,
#: seed 0. eta_min of eq. 1 stays one tenth of lr. The first grid (lr up to 0.2, C up to 5) peaked at
#: its corner (lr 0.2, C 5), so it was extended once by one value on each axis.
RECORD_GRID = {"lr": (0.005, 0.02, 0.05, 0.1, 0.2, 0.5), "dp_clip": (0.1, 1.0, 5.0, 20.0)}
RECORD_GRID_EPSILON = 10.0
RECORD_VALIDATION = 1_000
#: The grid's choice: its highest validation accuracy (tests/test_studies.py checks it against the
#: committed grid).
RECORD_TUNED = {"lr": 0.2, "dp_clip": 5.0}

#: Record-level DP-SGD tuned at the horizon it runs (issue 74). The quick grid above ran ~100 noisy steps
#: a client; a paper run takes ~19,000, and its choice (lr 0.2, C = 5) random-walked the weights to
#: 0.9-1.4 per coordinate and 2 of 3 seeds collapsed. This grid runs the paper profile's own schedule
#: (200 rounds, eq. 1's cosine lr over them, sigma calibrated for all of them, epsilon 10) and trains its
#: first PAPER_GRID_ROUNDS rounds (Config.train_rounds: the prefix of that run, the same draws), on the
#: full training set less a stratified hold-out of PAPER_VALIDATION images that it is evaluated on (the
#: test set is never read). lr x C spans lr C = 0.01 to 0.5 around published DP-SGD recipes' accumulated
#: noise (about 0.1 per coordinate; lr C = 1 was the quick grid's choice).
PAPER_GRID = {"lr": (0.01, 0.02, 0.05, 0.1), "dp_clip": (1.0, 5.0)}
PAPER_GRID_ROUNDS = 30
PAPER_VALIDATION = 6_000
#: The partition the paper grid trains on: the first seed whose partition (with the hold-out carved out)
#: gives a sigma at least the paper runs' largest (1.87, seed 1: its smallest client holds 631 images), so
#: the grid tunes under at least the noise any paper seed faces (seed 5: smallest client 584, sigma 1.96;
#: tests/test_studies.py recomputes it).
PAPER_GRID_SEED = 5
#: The paper grid's choice by its rule (pages.PAPER_GRID_RULE: the highest validation accuracy at its last
#: round among the settings that never collapsed): the (lr, C) the record-level reading trains at the
#: paper profile (tests/test_studies.py checks it against the committed grid). Its weights still grow
#: (norm 51 at round 30): whether it holds over the 200 rounds is what its seeds' collapse diagnostic says.
RECORD_TUNED_PAPER = {"lr": 0.1, "dp_clip": 1.0}

#: The readings of Fig. 2's "noise ... to the gradient update process" (issue 63): what each protects
#: and what it guarantees.
READINGS = {
    "central": Reading("client-level central", "replace one client",
                       "(epsilon, delta)-DP of a client's whole data; a trusted server adds the noise"),
    "local": Reading("client-level local", "replace one client",
                     "(epsilon, delta)-DP of a client's whole data; each client adds noise to its own "
                     "update"),
    "record": Reading("record-level DP-SGD", "add/remove one record",
                      "(epsilon, delta)-DP of one training example, composed over every local step"),
    "formula": Reading("the formula in circulation", "one record in one full-batch step",
                       "no valid guarantee: Delta_f = 2 lr C / n bounds one full-batch gradient step, not "
                       "the K minibatch steps of a round, and the T rounds are never composed", valid=False),
}

ABLATIONS = {
    "full": {},
    "no_dynamic_lr": {"cosine_lr": False},
    "no_dropout": {"dropout": 0.0},
    "no_pruning": {"prune": False},
    "no_all_three": {"cosine_lr": False, "dropout": 0.0, "prune": False},
}

FIG1_METHODS = ["fedavg", "scaffold", "feddyn", "moon", "ditto", "moon_dpap"]
TABLE1_METHODS = ["fedavg", "feddyn", "scaffold", "moon", "moon_dpap"]


#: How each profile scales the paper's setting (caps: the paper's value unless larger).
SCALES = {
    "smoke": Scale(
        "seconds, for the tests: 600 training and 300 test samples, 2 rounds, 4 clients at most",
        seeds=1,
        overrides={"train_samples": 600, "test_samples": 300},
        caps={"rounds": 2, "clients": 4},
    ),
    "quick": Scale(
        "a 2-core CPU: 4,000 training and 2,000 test samples, 20 rounds, 3 seeds",
        seeds=3,
        overrides={"train_samples": 4_000, "test_samples": 2_000},
        caps={"rounds": 20},
    ),
    "paper": Scale("the paper's setting: full FashionMNIST, 200 rounds, 3 seeds (a GPU)", seeds=3),
}


def config_for(method: str, profile: str, seed: int = 0, **changes) -> Config:
    """The config of ``method`` ('moon_dpap' means every component on) under ``profile``."""
    base = PAPER_SETTING.replace(seed=seed)
    base = base.replace(**FULL_DPAP) if method == "moon_dpap" else base.replace(algorithm=method)
    return scale_of(SCALES, profile).apply(base.replace(**changes), profile)
