"""Every source of randomness in a run has its own stream id, in one place.

A stream is seeded from a tuple of integers (:func:`fedlib.privacy.noise.generator_for`,
:func:`fedlib.privacy.discrete.rng_for`, ``numpy.random.default_rng``): the run's seed (or, for
privacy noise, its whole configuration key, see :meth:`fedlib.algorithms.base.Algorithm.noise_seed`),
the stream id, and the round and client where it applies. Changing an id changes results, so
ids are never reused or renumbered.
"""

from __future__ import annotations

from enum import IntEnum


class Stream(IntEnum):
    DATA_SUBSET = 7  # stratified subsets of the training and test data
    VALIDATION = 9  # the validation hold-out of the training data (tuning runs)
    PARTITION = 11  # the split of the data among clients
    BATCHES = 23  # each client's minibatch order, per round
    DROPOUT = 29  # dropout masks, per round and client
    SAMPLING = 31  # fixed-size client sampling, per round
    CENTRAL_NOISE = 37  # MOON-DPAP: noise on the sum (central mode)
    LOCAL_NOISE = 41  # MOON-DPAP: each client's noise (local mode)
    POISSON = 43  # DP-FedAvg: Poisson client sampling
    DP_FEDAVG_NOISE = 47  # DP-FedAvg: noise on the sum of updates
    DP_FEDAVG_COUNT = 48  # DP-FedAvg: noise on the count of unclipped updates (adaptive clipping)
    LDP_FL = 61  # LDP-FL's two-point mechanism
    SIGNDS_FL = 62  # SignDS-FL's selection
    FDL = 63  # FDL's selection and Laplace noise
    RECORD_SAMPLING = 71  # record-level DP-SGD: Poisson sampling of a client's records, per step
    RECORD_NOISE = 73  # record-level DP-SGD: the Gaussian noise of each local step
    FORMULA_NOISE = 79  # MOON-DPAP's formula in circulation: each client's noise on its update
