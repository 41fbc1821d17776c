import numpy as np
import pytest

from fedlib.config import Config, ConfigError
from fedlib.partition import dirichlet, iid, partition, shards, stats

LABELS = np.repeat(np.arange(10), 300)  # 3000 samples, 300 per class


def _assert_exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n)), "every sample exactly once"


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_every_sample_exactly_once_and_deterministic(scheme):
    cfg = Config(partition=scheme, clients=15, alpha=0.3, seed=4)
    a, b = partition(LABELS, cfg), partition(LABELS, cfg)
    _assert_exact_cover(a, len(LABELS))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = partition(LABELS, cfg.replace(seed=5))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_min_size_and_skew():
    rng = np.random.default_rng(0)
    parts = dirichlet(LABELS, 20, 0.1, rng, min_size=20)
    assert min(len(p) for p in parts) >= 20
    s = stats(parts, LABELS)
    assert s["classes"].mean() < 7  # strongly skewed at alpha = 0.1


def test_dirichlet_large_alpha_is_close_to_iid():
    parts = dirichlet(LABELS, 10, 1e5, np.random.default_rng(1))
    counts = stats(parts, LABELS).filter(like="class_").to_numpy()
    frac = counts / counts.sum(1, keepdims=True)
    assert np.abs(frac - 0.1).max() < 0.03


def test_dirichlet_impossible_raises():
    with pytest.raises(ConfigError, match="min_client_samples|exceeds"):
        dirichlet(LABELS, 400, 0.5, np.random.default_rng(0), min_size=10)


def test_iid_sizes_and_shards_classes():
    parts = iid(LABELS, 7, np.random.default_rng(0))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    sh = shards(LABELS, 10, 2, np.random.default_rng(0))
    _assert_exact_cover(sh, len(LABELS))
    assert stats(sh, LABELS)["classes"].max() <= 2 * 2  # a shard may straddle two labels


def test_stats_columns():
    s = stats(iid(LABELS, 5, np.random.default_rng(0)), LABELS)
    assert list(s.columns[:2]) == ["samples", "classes"] and s["samples"].sum() == len(LABELS)
