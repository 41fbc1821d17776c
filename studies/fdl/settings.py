"""FDL (Cheng, "Federated Learning Based on Dimension Selection"): the paper's setting, our
choices where it is silent, its published numbers (reference data, never results), and how each
profile scales the setting."""

from __future__ import annotations

from fedlib.config import Config
from studies.common import Scale, scale_of

#: Sec. 5.1 of the paper, plus our choices where it is silent (see CHOICES).
PAPER_SETTING = Config(
    algorithm="fedavg",
    dataset="mnist",
    model="mcmahan_cnn",
    clients=100,
    partition="iid",
    client_fraction=1.0,
    rounds=50,
    local_epochs=1,
    batch_size=64,
    lr=0.01,
    momentum=0.0,
    shards_per_client=2,
    ldp_clip=0.001,
    fdl_r=0.01,
    fdl_th=0.8,
)

#: Settings the paper gives (field: where).
GIVEN = {
    "dataset": "Sec. 5.1",
    "model": "Sec. 5.1 (McMahan et al.'s CNN)",
    "clients": "Sec. 5.1",
    "partition": "Sec. 5.1 (IID and non-IID; non-IID scheme not given)",
    "batch_size": "Sec. 5.1",
    "lr": "Sec. 5.1",
    "fdl_epsilon_per_draw": "Sec. 5.2 (Laplace epsilon 0.5)",
    "fdl_r": "Sec. 5.2",
    "fdl_th": "Sec. 5.2",
    "rounds": "Fig. 4 (50 rounds)",
}

#: The four methods of Fig. 3 (FDL as published) and our corrected FDL.
METHODS = {
    "noldp": ("NoLDP-FL (FedAvg)", dict(algorithm="fedavg")),
    "ldp_fl": ("LDP-FL", dict(algorithm="ldp_fl")),
    "signds_fl": ("SignDS-FL", dict(algorithm="signds_fl")),
    "fdl": ("FDL (as published)", dict(algorithm="fdl", fdl_mode="as_published")),
    "fdl_corrected": ("FDL (corrected)", dict(algorithm="fdl", fdl_mode="corrected")),
}
#: Controls of our repair (issue 63): the same clip, encoding and k, to tell its design from its
#: privacy: without noise (no privacy), with the server's d / k rescaling, and both.
REPAIR_CONTROLS = {
    "fdl_corrected_noise_free": ("our repair without noise (no privacy)",
                                 dict(algorithm="fdl", fdl_mode="corrected", fdl_noise_free=True)),
    "fdl_corrected_rescaled": ("our repair, server rescales by d/k",
                               dict(algorithm="fdl", fdl_mode="corrected", fdl_server_rescale=True)),
    "fdl_corrected_noise_free_rescaled": ("our repair without noise, rescaled by d/k (no privacy)",
                                          dict(algorithm="fdl", fdl_mode="corrected", fdl_noise_free=True,
                                               fdl_server_rescale=True)),
}
COLOR_KEY = {
    "fdl_corrected_noise_free": "moon",
    "fdl_corrected_rescaled": "scaffold",
    "fdl_corrected_noise_free_rescaled": "feddyn",
    "noldp": "fedavg",
    "ldp_fl": "ldp_fl",
    "signds_fl": "signds_fl",
    "fdl": "fdl",
    "fdl_corrected": "dp_fedavg_adaptive",
}

EPSILONS = (0.1, 0.25, 0.5, 0.75, 1.0)
R_VALUES = (0.015, 0.012, 0.010, 0.008)

#: Published numbers.
PAPER = {
    # r: (C_r / C, C_s / C, accuracy %)
    "table1": {
        0.015: (0.22, 0.16, 53.25),
        0.012: (0.35, 0.28, 74.50),
        0.010: (0.47, 0.38, 94.83),
        0.008: (0.58, 0.46, 87.46),
    },
    "saving": 60.0,  # "saves at least 60 % of the communication cost"
}

CHOICES = [
    (
        "update vs weights",
        "the update: local weights minus the global weights",
        "Alg. 1 says 'parameters'; its motivation (most values near 0) is about updates",
    ),
    (
        "normalisation (as published)",
        "divide by the client's max |update|, sent along",
        "'normalize the parameters' into [-1, 1]; the server needs the scale back",
    ),
    ("filter", "|v| > r", "the text's w > r would drop every negative value"),
    ("Laplace scale (as published)", "2 / epsilon", "sensitivity of a value in [-1, 1]; not given"),
    ("aggregation", "sample-weighted mean, unsent dimensions count as 0", "not given (sparse FedAvg)"),
    ("non-IID", "2 label shards per client (McMahan et al. 2017)", "not described"),
    (
        "public clip c (LDP-FL range, corrected FDL)",
        0.001,
        "about the 99.9th percentile of |update coordinate| in a first non-private round",
    ),
    ("corrected FDL: k, budget split", "k = 100, half for selection, half for values", "our repair"),
    (
        "corrected FDL: the server's aggregation",
        "the mean of the sparse reports, unsent dimensions as 0 (no d/k rescaling)",
        "our repair keeps FDL's sparse FedAvg; the rescaled variant is run beside it as a control",
    ),
    ("local epochs", 1, "not given; one pass over the client's data per round (McMahan et al.'s E = 1)"),
    ("client fraction", 1.0, "not given; every client in every round (the paper's 100 clients)"),
    (
        "SignDS-FL",
        "kappa = 0.01, h = 100, rho = 0.6, eta_g = 0.01",
        "MindSpore defaults for kappa, rho; h and eta_g ours (fixed step, no private step estimate)",
    ),
    (
        "quick profile",
        "MLP 784-100-10, 12,000 images (120 per client), 20 rounds, 3 seeds",
        "the paper's CNN and 50 rounds need a GPU (paper profile)",
    ),
]


#: Each method's own epsilon field: the sweep's "epsilon" means the method's published parameter.
EPSILON_FIELD = {
    "ldp_fl": "ldp_fl_epsilon_per_coordinate",
    "signds_fl": "signds_epsilon_per_round",
    "fdl": "fdl_epsilon_per_draw",
    "fdl_corrected": "fdl_epsilon_per_round",
    "fdl_corrected_rescaled": "fdl_epsilon_per_round",
}

#: The quick profile swaps the 1.66M-parameter CNN for the 79,510-parameter MLP: 40+ runs of the
#: CNN with per-round mechanisms over 1.66M dimensions do not fit a CPU.
SCALES = {
    "smoke": Scale(
        "seconds, for the tests: MLP, 10 clients, 600 samples, 2 rounds",
        seeds=1,
        overrides=dict(model="mlp", clients=10, train_samples=600, test_samples=300, rounds=2),
    ),
    "quick": Scale(
        "a 2-core CPU: MLP 784-100-10, 100 clients of 120 images, 20 rounds, 3 seeds",
        seeds=3,
        overrides=dict(model="mlp", clients=100, train_samples=12_000, test_samples=2_000, rounds=20),
    ),
    "paper": Scale(
        "the paper's setting: McMahan et al.'s CNN, full MNIST, 100 clients, 50 rounds, 3 seeds (the "
        "paper averages 10 runs; 3 fit the GPU time this project gets, and `--seeds` adds more)",
        seeds=3,
        overrides=dict(model="mcmahan_cnn", clients=100, train_samples=0, test_samples=0, rounds=50),
    ),
}


def config_for(
    method: str, profile: str, seed: int = 0, partition: str = "iid", epsilon: float = 0.5, **changes
) -> Config:
    """``method`` (a key of :data:`METHODS` or :data:`REPAIR_CONTROLS`) at nominal budget ``epsilon``
    (the method's own meaning, :data:`EPSILON_FIELD`) on the ``iid`` or ``noniid`` (2 shards per
    client) partition."""
    base = PAPER_SETTING.replace(seed=seed, partition="shards" if partition == "noniid" else partition)
    cfg = scale_of(SCALES, profile).apply(base.replace(**{**METHODS, **REPAIR_CONTROLS}[method][1]), profile)
    if method in EPSILON_FIELD:
        cfg = cfg.replace(**{EPSILON_FIELD[method]: epsilon})
    return cfg.replace(**changes)
