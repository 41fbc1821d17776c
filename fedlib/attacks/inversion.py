"""Gradient inversion: DLG (Zhu, Liu, Han, NeurIPS 2019) with iDLG's label trick (Zhao,
Mopuri, Bilen 2020), against an undefended gradient, clipping only, and clipping plus
Gaussian noise (the DP-SGD / DP-FedAvg defence).

The attacker sees the gradient ``g*`` of one image's loss with respect to the weights of a
known network, infers the label from the last layer's gradient (iDLG), and optimises a
dummy image ``x'`` (L-BFGS) so that its gradient matches: ``min ||grad(x') - g*||^2``.
Clipping only rescales ``g*``; noise is what destroys the information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.privacy.clipping import clip_by_l2
from fedlib.privacy.noise import gaussian_noise_like


class DLGNet(nn.Module):
    """The small attack network of the DLG reference code: three 5x5 conv layers with sigmoid
    activations (strides 2, 2, 1; 12 channels) and a linear classifier; weights ~ U(-0.5, 0.5)."""

    def __init__(self, num_classes: int = 10, channels: int = 1, side: int = 28):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, 5, stride=2, padding=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, stride=2, padding=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, stride=1, padding=2), nn.Sigmoid(),
        )
        self.fc = nn.Linear(12 * math.ceil(side / 4) ** 2, num_classes)
        for p in self.parameters():
            nn.init.uniform_(p, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def target_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient of the cross-entropy of ``(x, y)`` with respect to ``model``'s parameters: what a
    client shares in one step of FedSGD, and what gradient inversion starts from."""
    loss = F.cross_entropy(model(x), y)
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in model.named_parameters()])
    return {n: g.detach() for n, g in zip(names, grads, strict=True)}


def defend(grads: dict[str, torch.Tensor], clip: float | None = None, noise_multiplier: float = 0.0,
           seed: int = 0) -> dict[str, torch.Tensor]:
    """Clip the gradient to L2 norm ``clip`` (if given), then add N(0, (z C)^2) per coordinate."""
    out = grads
    if clip is not None:
        out, _ = clip_by_l2(out, clip)
    if noise_multiplier > 0:
        if clip is None:
            raise ValueError("noise is calibrated to the clip norm; give clip")
        noise = gaussian_noise_like(out, noise_multiplier * clip, torch.Generator().manual_seed(seed))
        out = {k: v + noise[k] for k, v in out.items()}
    return out


def infer_label(grads: dict[str, torch.Tensor], last_weight: str = "fc.weight") -> int:
    """iDLG: with softmax cross-entropy only the true class's row has a negative sum."""
    return int(grads[last_weight].sum(-1).argmin())


@dataclass
class Reconstruction:
    """A gradient-inversion attempt: the image and label it recovered, its error against the true image
    (MSE, PSNR) and the final gradient distance it reached."""
    image: torch.Tensor
    label: int
    mse: float
    psnr: float
    final_distance: float


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio (dB) of ``a`` against ``b`` for values in ``[0, data_range]``."""
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * math.log10(data_range ** 2 / mse)


def dlg_attack(model: nn.Module, grads: dict[str, torch.Tensor], shape: tuple[int, ...],
               truth: torch.Tensor | None = None, steps: int = 100, seed: int = 0,
               data_range: float = 1.0, distance: str = "l2", box: bool = True) -> Reconstruction:
    """Reconstruct one input from ``grads`` by L-BFGS on a gradient distance: ``l2`` (DLG's
    squared distance) or ``cosine`` (1 - cosine similarity, Geiping et al. 2020), which is
    blind to the gradient's scale and so unaffected by clipping.

    ``box``: the attacker knows the pixel range and projects the dummy image into
    ``[0, data_range]`` after every L-BFGS step (without it, a noisy target gradient drives the
    dummy to huge values and the error measures divergence, not leakage)."""
    if distance not in ("l2", "cosine"):
        raise ValueError(f"distance must be l2 or cosine, got {distance!r}")
    label = infer_label(grads)
    device = next(iter(grads.values())).device
    y = torch.tensor([label], device=device)
    g = torch.Generator().manual_seed(seed)
    dummy = torch.rand(shape, generator=g).to(device).requires_grad_(True)
    params = [p for _, p in model.named_parameters()]
    target = [grads[n] for n, _ in model.named_parameters()]
    opt = torch.optim.LBFGS([dummy], lr=1.0, max_iter=20, history_size=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        dg = torch.autograd.grad(F.cross_entropy(model(dummy), y), params, create_graph=True)
        if distance == "l2":
            dist = sum(((a - b) ** 2).sum() for a, b in zip(dg, target, strict=True))
        else:
            dot = sum((a * b).sum() for a, b in zip(dg, target, strict=True))
            na = torch.sqrt(sum((a ** 2).sum() for a in dg))
            nb = torch.sqrt(sum((b ** 2).sum() for b in target))
            dist = 1 - dot / (na * nb + 1e-12)
        dist.backward()
        return dist

    dist = float("nan")
    for _ in range(steps):
        dist = float(opt.step(closure).detach())
        if box:
            with torch.no_grad():
                dummy.clamp_(0.0, data_range)
    img = dummy.detach()
    if truth is None:
        return Reconstruction(img, label, float("nan"), float("nan"), dist)
    return Reconstruction(img, label, float(((img - truth) ** 2).mean()), psnr(img, truth, data_range), dist)
