"""Split a labelled training set among clients: IID, Dirichlet label skew, shards.

All functions are deterministic given the ``numpy.random.Generator`` they receive and
return one sorted ``int64`` index array per client; every sample goes to exactly one client.
"""

from __future__ import annotations

import numpy as np

from fedlib.config import Config, ConfigError
from fedlib.streams import Stream


def iid(labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal the samples into ``n_clients`` parts of (almost) equal size."""
    perm = rng.permutation(len(labels))
    return [np.sort(p) for p in np.array_split(perm, n_clients)]


def dirichlet(labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 10, balance_cap: bool = True, max_tries: int = 1000) -> list[np.ndarray]:
    """Label skew as in NIID-Bench (Li et al., ICDE 2022, 'noniid-labeldir').

    For each class ``k`` draw client proportions ``p ~ Dir(alpha * 1_N)`` and cut the
    (shuffled) samples of class ``k`` by the cumulative proportions. The whole draw is
    repeated until every client holds at least ``min_size`` samples.

    ``balance_cap`` (on by default, as in NIID-Bench and the MOON code): while dealing,
    a client that already holds ``>= len(labels) / n_clients`` samples gets no share of
    the remaining classes. This bounds quantity skew, so that label skew is what varies
    with ``alpha``; without it, small ``alpha`` also gives a few huge clients.
    """
    if alpha <= 0:
        raise ConfigError(f"alpha must be > 0, got {alpha}")
    n = len(labels)
    if n_clients * min_size > n:
        raise ConfigError(f"{n_clients} clients x {min_size} samples exceeds {n} samples")
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    cap = n / n_clients
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(n_clients, alpha))
            if balance_cap:
                p = p * np.array([len(c) < cap for c in parts])
                p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for c, chunk in zip(parts, np.split(idx_k, cuts), strict=True):
                c.extend(chunk.tolist())
        if min(len(c) for c in parts) >= min_size:
            return [np.sort(np.asarray(c, dtype=np.int64)) for c in parts]
    raise ConfigError(
        f"Dirichlet partition: no draw in {max_tries} tries gave every one of {n_clients} clients "
        f">= {min_size} samples (alpha={alpha}); lower min_client_samples or raise alpha"
    )


def shards(labels: np.ndarray, n_clients: int, shards_per_client: int,
           rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al. (2017) pathological non-IID: sort by label, cut into
    ``n_clients * shards_per_client`` shards, give each client ``shards_per_client``."""
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, n_clients * shards_per_client)
    assignment = rng.permutation(len(pieces)).reshape(n_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[j] for j in row])) for row in assignment]


def partition(labels: np.ndarray, config: Config) -> list[np.ndarray]:
    """Partition ``labels`` as ``config`` says (seeded by ``config.seed``)."""
    rng = np.random.default_rng([config.seed, Stream.PARTITION])
    if config.partition == "iid":
        return iid(labels, config.clients, rng)
    if config.partition == "dirichlet":
        return dirichlet(labels, config.clients, config.alpha, rng, config.min_client_samples)
    if config.partition == "shards":
        return shards(labels, config.clients, config.shards_per_client, rng)
    raise ConfigError(f"unknown partition {config.partition!r}")


def stats(parts: list[np.ndarray], labels: np.ndarray, num_classes: int = 10):
    """One row per client: sample count, number of classes present, and per-class counts."""
    counts = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
    import pandas as pd  # here: a Flower ClientApp, which imports this module, never needs it

    df = pd.DataFrame(counts, columns=[f"class_{k}" for k in range(num_classes)])
    df.insert(0, "classes", (counts > 0).sum(1))
    df.insert(0, "samples", counts.sum(1))
    df.index.name = "client"
    return df
