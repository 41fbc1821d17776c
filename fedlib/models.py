"""The two networks of the study.

Both take (B, 1, 28, 28) inputs and return logits. ``forward(x, dropout_mask=None,
return_repr=False)``: dropout is applied with an *explicit* mask (drawn by the engine from
a seeded generator) so that the sequential and the client-vectorized engine paths see
the same randomness; ``return_repr=True`` also returns the representation before the
classifier (MOON contrasts it).

Parameter counts (10 classes): ``cnn`` 424,266; ``mcmahan_cnn`` 1,663,370 (the count
given by McMahan et al. 2017).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MoonDpapCNN(nn.Module):
    """CNN of MOON-DPAP (Su, ICDSE 2025, Sec. 4.1): two conv layers, one max-pool, two
    fully connected layers, ReLU after each hidden layer, optional dropout.

    The paper gives no widths; we choose conv 1->16 (5x5), conv 16->32 (5x5), 2x2 max-pool,
    FC 3200->128 (the representation), FC 128->10 (the classifier). Dropout, when enabled,
    acts on the 128-d representation before the classifier.
    """

    repr_dim = 128

    def __init__(self, num_classes: int = 10, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 10 * 10, self.repr_dim)
        self.fc2 = nn.Linear(self.repr_dim, num_classes)

    def forward(self, x: torch.Tensor, dropout_mask: torch.Tensor | None = None,
                return_repr: bool = False):
        h = F.relu(self.conv1(x))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        rep = F.relu(self.fc1(h.flatten(1)))
        z = rep if dropout_mask is None else rep * dropout_mask / (1.0 - self.dropout)
        logits = self.fc2(z)
        return (logits, rep) if return_repr else logits


class McMahanCNN(nn.Module):
    """MNIST CNN of McMahan et al. (AISTATS 2017, Sec. 3): 5x5 conv 32 and 64 channels
    ('same' padding), each followed by 2x2 max-pooling, FC 512 with ReLU, softmax output;
    1,663,370 parameters. Used by FDL (Cheng)."""

    repr_dim = 512

    def __init__(self, num_classes: int = 10, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, self.repr_dim)
        self.fc2 = nn.Linear(self.repr_dim, num_classes)

    def forward(self, x: torch.Tensor, dropout_mask: torch.Tensor | None = None,
                return_repr: bool = False):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        rep = F.relu(self.fc1(h.flatten(1)))
        z = rep if dropout_mask is None else rep * dropout_mask / (1.0 - self.dropout)
        logits = self.fc2(z)
        return (logits, rep) if return_repr else logits


MODEL_CLASSES: dict[str, type[nn.Module]] = {"cnn": MoonDpapCNN, "mcmahan_cnn": McMahanCNN}


def build_model(name: str, num_classes: int = 10, dropout: float = 0.0) -> nn.Module:
    try:
        return MODEL_CLASSES[name](num_classes=num_classes, dropout=dropout)
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODEL_CLASSES)}") from None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
