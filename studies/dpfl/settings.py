"""The DP-FL analysis (Dutra, in Portuguese): our federation (the article is a survey with no
experimental setting), the article's claims as stated (reference text), and how each profile
scales the federation."""

from __future__ import annotations

import functools
import math

from fedlib.config import Config
from fedlib.privacy.accounting import calibrate_rdp, calibrate_replace_one
from studies.common import Scale, scale_of

#: The federation of the chapter (our choices; the article gives none).
SETTING = Config(
    algorithm="dp_fedavg",
    dataset="fashionmnist",
    model="mlp",
    clients=1000,
    partition="iid",
    client_fraction=0.1,
    rounds=50,
    local_epochs=1,
    batch_size=10,
    lr=0.1,
    momentum=0.0,
    server_lr=1.0,
    dp="none",
    dp_clip=0.5,
    dp_delta=1e-5,
    dp_noise_multiplier=0.0,
)

#: Settings the sources give (field: where). The article itself gives none for experiments.
GIVEN = {
    "clip_quantile": "Andrew et al. 2021 (gamma = 0.5)",
    "clip_lr": "Andrew et al. 2021 (eta_C = 0.2)",
    "clip_count_std": "Andrew et al. 2021 (sigma_b = m / 20)",
    "algorithm": "the article's DP-FedAvg (McMahan et al. 2018)",
}

#: Privacy budgets of Claim 1 (total epsilon of the whole run at delta = 1e-5).
EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

#: Every setting we chose: (setting, value, why).
CHOICES = [
    (
        "dataset, clients",
        "FashionMNIST, 1,000 IID clients of 60 images",
        "the article lists MNIST, CIFAR-10 and synthetic data but gives no federation, model or "
        "result for any of them; client-level DP needs many clients",
    ),
    ("model", "MLP 784-100-10 (79,510 parameters)", "noise grows with sqrt(d); a CNN needs far more clients"),
    ("sampling", "Poisson, q = 0.1 (100 clients expected per round)", "what the accountant assumes"),
    ("local training", "1 epoch, batch 10, SGD lr 0.1", "FedAvg defaults of McMahan et al. 2017"),
    ("server", "learning rate 1, fixed denominator qN", "DP-FedAvg (McMahan et al. 2018)"),
    ("clip norm C (fixed)", 0.5, "near the median update norm of the non-private run (measured on the page)"),
    (
        "adaptive clipping",
        "C0 = 0.1, eta_C = 0.2, sigma_b = qN/20; gamma = 0.5 and server lr 1, and on the claim 2 page "
        "gamma 0.1, 0.3, 0.5 with server lr 0.1 to 4",
        "Andrew et al. 2021 defaults; the grid tunes adaptive clipping as the fixed-C sweep tunes fixed "
        "clipping (the article gives no setting)",
    ),
    ("delta", 1e-5, "< 1 / number of clients"),
    (
        "noise calibration",
        "constant z per round, RDP accountant at integer orders (PLD reported too)",
        "the article's sigma_t = sigma_base factor(t, T) is not specified; constant is the standard",
    ),
    (
        "neighbouring relation",
        "add/remove one client, fixed denominator qN (McMahan et al. 2018)",
        "the article does not say; the membership audit uses replace-one, which covers one record",
    ),
]

#: The article's claims, as stated (reference text, not results).
ARTICLE = {
    "claim1": r"$\text{Acc}(\epsilon) \approx \text{Acc}_{\max} - \alpha \log(1/\epsilon + 1)$ for "
    r"$\epsilon \in [0.1, 10]$",
    "claim2": "adaptive clipping: 15-25 % higher final accuracy than fixed clipping at the same privacy",
    "claim2_range": (15.0, 25.0),
    "claim3": r"membership-inference advantage $\le e^\epsilon - 1$ ($\epsilon < 1$)",
    "claim4": r"gradient inversion is prevented by DP noise; reconstruction error "
    r"$\ge \Omega(\sigma\sqrt{d})$",
    "cost": "DP adds 20-30 % to the training time",
    "cost_range": (20.0, 30.0),
}


#: The chapter's runs at each profile. Full training data (60 images per client) at quick and
#: paper, because client-level DP needs the 1,000 clients.
SCALES = {
    "smoke": Scale(
        "seconds, for the tests: 400 clients, 6,000 images, 2 rounds",
        seeds=1,
        overrides=dict(rounds=2, clients=400, train_samples=6_000, test_samples=500),
        comparable=False,
    ),
    "quick": Scale(
        "a 2-core CPU: 1,000 clients of 60 images, 20 rounds, 3 seeds",
        seeds=3,
        overrides=dict(rounds=20, clients=1000, train_samples=0, test_samples=5_000),
        comparable=False,
    ),
    "paper": Scale(
        "our federation's full profile (the article runs no experiment): 1,000 clients, 100 rounds, "
        "full test set, 5 seeds",
        seeds=5,
        overrides=dict(rounds=100, clients=1000, train_samples=0, test_samples=0),
        comparable=False,
    ),
}


def base_config(profile: str, seed: int = 0, **changes) -> Config:
    return scale_of(SCALES, profile).apply(SETTING.replace(seed=seed), profile).replace(**changes)


def noise_for(epsilon: float, config: Config) -> float:
    """Constant noise multiplier z spending ``epsilon`` (at ``dp_delta``, add/remove one client)
    over the run, by the accountant the runs use (RDP at integer orders); rounded up to 6 digits."""
    z = calibrate_rdp(epsilon, config.dp_delta, config.rounds, q=config.client_fraction)
    return math.ceil(z * 1e6) / 1e6


def config_for(profile: str, epsilon: float | None, seed: int = 0, **changes) -> Config:
    """DP-FedAvg at total ``epsilon`` (``None``: no clipping, no noise: plain FedAvg with the
    same Poisson sampling and server step)."""
    c = base_config(profile, seed, **changes)
    if epsilon is None:
        return c.replace(dp_clip=1e9, dp_noise_multiplier=0.0, adaptive_clip=False)
    return c.replace(dp_noise_multiplier=noise_for(epsilon, c))


#: A small federation that overfits (so the non-private model leaks): 20 clients of 25 images,
#: every client every round, 5 local epochs.
MIA_SETTING = dict(
    clients=20,
    train_samples=500,
    test_samples=500,
    client_fraction=1.0,
    local_epochs=5,
    batch_size=5,
    lr=0.05,
)
MIA_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
MIA_ROUNDS = {"smoke": 2, "quick": 20, "paper": 100}


def mia_config(profile: str, epsilon: float | None, seed: int = 0) -> Config:
    """The audit's federation with noise calibrated so that *replacing* one client's data (and so
    any one of its records, the change a membership attack tests) costs ``epsilon``."""
    c = base_config(profile, seed).replace(rounds=MIA_ROUNDS[profile], **MIA_SETTING)
    if epsilon is None:
        return c.replace(dp_clip=1e9, dp_noise_multiplier=0.0)
    z = 2 * calibrate_rdp(epsilon, c.dp_delta, c.rounds, q=1.0)  # sensitivity 2C under replace-one
    return c.replace(dp_clip=1.0, dp_noise_multiplier=math.ceil(z * 1e6) / 1e6)


#: The second audit federation, where the private models learn: client-level DP needs many clients
#: per round and amplification by sampling, so this is the chapter's federation (1,000 clients,
#: Poisson rate 0.1, fixed C = 0.5) with 10 images per client instead of 60 and 5 local epochs, so
#: that the model without DP sees each image about 50 times and overfits enough to leak.
MIA_LEARNING_SETTING = dict(
    train_samples=10_000,
    local_epochs=5,
    batch_size=10,
    client_fraction=0.1,
    secure_noise=False,
)
#: Clients of the learning audit by profile (10 images each): smoke keeps the tests fast.
MIA_LEARNING_CLIENTS = {"smoke": 200, "quick": 1000, "paper": 1000}
#: Replace-one budgets of the learning audit: the article's range (epsilon < 1, where e^eps - 1 < 1.72)
#: and one above it.
MIA_LEARNING_EPSILONS = (0.25, 0.5, 1.0, 2.0)


@functools.lru_cache(maxsize=64)
def replace_one_noise(epsilon: float, delta: float, rounds: int, q: float) -> float:
    """The constant multiplier spending ``epsilon`` over ``rounds`` Poisson-sampled rounds when one
    client's data are *replaced* (PLD, dp-accounting's replace-one dominating pair), rounded up to
    6 digits. The pair is for the continuous Gaussian, so the runs use float Gaussian noise
    (``secure_noise=False``): the integer-order RDP argument that covers fedlib's discrete noise is
    for add/remove neighbours."""
    z = calibrate_replace_one(epsilon, delta, rounds, q)
    return math.ceil(z * 1e6) / 1e6


def mia_learning_config(profile: str, epsilon: float | None, seed: int = 0) -> Config:
    """The learning audit's federation at replace-one ``epsilon`` (``None``: without DP)."""
    n = MIA_LEARNING_CLIENTS[profile]
    c = base_config(profile, seed).replace(
        **{**MIA_LEARNING_SETTING, "clients": n, "train_samples": 10 * n})
    if epsilon is None:
        return c.replace(dp_clip=1e9, dp_noise_multiplier=0.0)
    return c.replace(dp_noise_multiplier=replace_one_noise(epsilon, c.dp_delta, c.rounds, c.client_fraction))
