"""Noise mechanisms on parameter trees, drawn from an explicit seeded generator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from fedlib.kernels import step_noise as step_noise_option
from fedlib.privacy.philox import gaussians
from fedlib.privacy.record import note_draw, note_key
from fedlib.tree import Tree, tmap


def generator_for(*parts: int, device: torch.device | str | None = None) -> torch.Generator:
    """A generator seeded from a tuple of integers (e.g. seed, stream, round, client), so each source
    of randomness has its own reproducible stream on every engine path.

    ``device`` None or a CPU: a CPU generator, the stream every CPU result was drawn from. A GPU: a
    generator on that GPU seeded with the same integer (PyTorch's Philox there: another stream, so
    a GPU run's draws are reproducible on GPUs, not equal to the CPU's, as for
    :class:`StepNoise`). The draws then happen where the data is, without a host round trip per
    client (issue 37). The mechanisms' floating-point care does not depend on the device: they ask
    for float64 uniforms on ``[0, 1)`` and treat the atom at 0 themselves (``clamp_min(2^-53)``),
    which covers a generator whose uniforms have fewer than 53 random bits or include 0."""
    note_key("torch", parts)
    seed = int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
    dev = torch.device("cpu") if device is None else torch.device(device)
    return torch.Generator(device=dev).manual_seed(seed)


def gaussian_noise_like(tree: Tree, std: float, generator: torch.Generator) -> Tree:
    """Independent N(0, std^2) for every coordinate of ``tree``, drawn from ``generator`` on its
    device (:func:`generator_for`), then moved to each leaf's device."""
    if std < 0:
        raise ValueError(f"noise std must be >= 0, got {std}")

    def draw(x: torch.Tensor) -> torch.Tensor:
        z = torch.randn(x.shape, generator=generator, dtype=torch.float32, device=generator.device)
        return (z * std).to(device=x.device, dtype=x.dtype)

    return tmap(draw, tree)


def laplace_noise_like(tree: Tree, scale: float, generator: torch.Generator) -> Tree:
    """Independent Laplace(0, scale) for every coordinate, by the inverse CDF of a float64 uniform
    ``U`` on [0, 1): ``-scale sign(u) log(1 - 2|u|)`` with ``u = U - 1/2``. ``U = 0`` (probability
    2^-53 per draw) would give an infinite draw; it is moved to the next float64 value, 2^-53, so
    every draw is finite (at most ``52 ln 2`` scales, as at ``U`` just below 1)."""
    if scale < 0:
        raise ValueError(f"Laplace scale must be >= 0, got {scale}")

    def draw(x: torch.Tensor) -> torch.Tensor:
        u = torch.rand(x.shape, generator=generator, dtype=torch.float64,
                       device=generator.device).clamp_min(2.0 ** -53) - 0.5
        lap = -scale * torch.sign(u) * torch.log1p(-2 * u.abs())
        return lap.to(device=x.device, dtype=x.dtype)

    return tmap(draw, tree)


@dataclass(frozen=True)
class StepNoise:
    """The Gaussian noise of every local step of record-level DP-SGD, drawn where it is used.

    A client's step ``s`` in the round gets ``N(0, std^2)`` on every coordinate of a tree shaped
    like ``shapes``, from a generator keyed by ``(*key, client, s)`` (``key``: the run's privacy
    key, the stream and the round, see :meth:`fedlib.algorithms.base.Algorithm.noise_seed`). Every
    engine path asks for the same (client, step) pairs, so they add the same noise. The generator
    lives on the run's device (a GPU draws its own noise; a CPU generator would make the host the
    bottleneck), so the noise is reproducible on one device kind, not across kinds.
    """

    key: tuple[int, ...]
    std: float
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: torch.dtype
    device: torch.device
    #: The L2 sensitivity the noise is calibrated against (the per-sample clip C): each client
    #: records ``std / sensitivity`` as the multiplier its steps released (fedlib.privacy.record).
    sensitivity: float = 1.0
    #: How the noise is drawn (:func:`fedlib.kernels.step_noise` when the round's noise is made):
    #: False, ``generator``: a ``torch.Generator`` seeded per (client, step), the stream of every
    #: committed result; True, ``counter``: Philox4x32-10 keyed by ``key`` and countered by
    #: (client, step) (:mod:`fedlib.privacy.philox`), so that the lanes of a vectorized step draw
    #: together in one fixed set of operators (:meth:`lanes`). Both are N(0, std^2) per coordinate.
    counter: bool = field(default_factory=lambda: step_noise_option() == "counter")
    #: Each client's own std, indexed by client id, where clients are calibrated apart (record-level
    #: DP-SGD with one sigma per client); None: ``std`` for every client.
    client_std: tuple[float, ...] | None = None

    def std_of(self, client: int) -> float:
        """The noise std of client ``client``'s steps."""
        return self.std if self.client_std is None else self.client_std[client]

    @property
    def size(self) -> int:
        """Coordinates per draw (every tensor of ``shapes``)."""
        return sum(math.prod(shape) for _, shape in self.shapes)

    def philox_key(self) -> tuple[int, int]:
        """The two 32-bit Philox key words of this round's noise (from ``key``, as every stream's)."""
        return tuple(int(w) for w in np.random.SeedSequence(list(self.key)).generate_state(2))

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """(R, size) values as the tree ``shapes`` describes, each leaf ``(R, *shape)`` (views)."""
        out, at = {}, 0
        for name, shape in self.shapes:
            k = math.prod(shape)
            out[name] = flat[:, at:at + k].reshape(flat.shape[0], *shape)
            at += k
        return out

    def draw(self, client: int, step: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s noise at local step ``step``: ``N(0, std^2)`` (:meth:`std_of`) for every
        coordinate of the model, from that client and step's own generator (or Philox counters,
        ``counter``)."""
        if self.counter:
            note_key("philox", (*self.key, client, step))
            key = torch.tensor([self.philox_key()], dtype=torch.int64, device=self.device)
            stream = torch.tensor([[client, step]], dtype=torch.int64, device=self.device)
            scale = torch.tensor([self.std_of(client)], dtype=self.dtype, device=self.device)
            noise = {k: v[0] for k, v in self.lanes(key, stream, scale, self).items()}  # one lane
        else:
            note_key("torch", (*self.key, client, step))
            seed = int(np.random.SeedSequence([*self.key, client, step]).generate_state(1)[0])
            g = torch.Generator(device=self.device).manual_seed(seed)
            std = self.std_of(client)
            noise = {name: torch.randn(shape, generator=g, device=self.device, dtype=self.dtype) * std
                     for name, shape in self.shapes}
        note_draw("dpsgd_step", *noise.values())
        return noise

    @staticmethod
    def lanes(key: torch.Tensor, stream: torch.Tensor, scale: torch.Tensor, like: StepNoise
              ) -> dict[str, torch.Tensor]:
        """Every lane's noise of one vectorized step in one draw (``counter`` noise only): lane ``l``
        gets ``scale[l] * z`` with ``z`` the Philox normals of key ``key[l]`` and stream
        ``stream[l] = (client, step)``, exactly what :meth:`draw` gives that (client, step) when
        ``scale[l]`` is its ``std`` (0 on a lane that has finished). The same operators whatever
        the lanes, and whatever runs they come from (each lane carries its run's key and std)."""
        flat = gaussians(key, stream, like.size, like.dtype) * scale[:, None]
        return like.split(flat)

    def zeros(self) -> dict[str, torch.Tensor]:
        """The noise of a padded (inactive) step."""
        return {name: torch.zeros(shape, device=self.device, dtype=self.dtype) for name, shape in self.shapes}
