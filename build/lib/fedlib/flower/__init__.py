"""fedlib's algorithms as Flower apps (an optional extra: ``pip install -e .[flower]``).

`Flower <https://flower.ai>`_ (Beutel et al. 2020) runs federated learning as real systems: a
``ServerApp`` on a SuperLink sends messages to ``ClientApp`` s on SuperNodes (other processes or
machines), or to virtual nodes in its simulation engine (Ray). This package runs any fedlib
algorithm that way, unchanged:

* :mod:`fedlib.flower.client`: the ``ClientApp``. On a ``train`` message it runs the algorithm's
  own ``client_init`` / ``client_step`` x K / ``client_final`` on its partition (the engine's
  sequential path for one client), applies the algorithm's client-side randomiser (local DP) and
  replies with the upload; its state across rounds (SCAFFOLD's control variate, MOON's previous
  model, Ditto's personal model) lives in the node's ``context.state``, as Flower recommends.
* :mod:`fedlib.flower.server`: :class:`~fedlib.flower.server.FedlibStrategy`, a Flower
  ``Strategy`` whose aggregation is the algorithm's own server step
  (:meth:`fedlib.experiment.Experiment.aggregate`: central DP through :mod:`fedlib.privacy.central`,
  epsilon through the run's accountant), and the ``ServerApp``.
* :mod:`fedlib.flower.simulation`: :func:`run_flower` runs one configuration through Flower's
  simulation engine and writes a result like :func:`fedlib.run` does, under
  ``data/results/flower/simulation/`` (a deployment's under ``flower/deployment/``), marked
  ``engine: flower``; ``python -m fedlib.flower run ...``.

Given the same config, a Flower run computes the same function as fedlib's engine: the same
client sampling, minibatches, dropout masks and privacy noise (all keyed by the config, round
and client id, not by where the client runs), so the global models agree to float rounding
(tested). In this simulation every node derives its partition from the shared config and seed;
in a deployment each SuperNode would hold its own data.

Every algorithm runs through Flower: local randomisers (LDP-FL, SignDS-FL, FDL, MOON-DPAP's
local mode) are part of each client's computation, keyed on its own client id. Ditto's
personalised accuracy is not reported (its personal models stay on the clients).
"""

from __future__ import annotations

import os

from fedlib.config import Config, ConfigError

# Flower reads these when it is imported: no usage telemetry (these machines have no internet,
# and a study should not phone home), no Ray dashboard.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

def check_supported(config: Config) -> None:
    """Raise :class:`ConfigError` before any work when ``config`` cannot run through Flower."""
    if config.precision == "float64":
        raise ConfigError("precision float64 is not supported through Flower (its arrays travel as float32)")


def require_flower() -> None:
    """A clear error when the optional ``flwr`` extra is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as e:
        raise ImportError("fedlib.flower needs Flower: pip install -e '.[flower]' "
                          "(flwr[simulation]; see requirements-flower.txt)") from e
