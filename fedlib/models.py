"""The two networks of the study.

Both take (B, 1, 28, 28) inputs and return logits. ``forward(x, dropout_mask=None,
return_repr=False)``: dropout is applied with an *explicit* mask (drawn by the engine from
a seeded generator) so that the sequential and the client-vectorized engine paths see
the same randomness; ``return_repr=True`` also returns the representation before the
classifier (MOON contrasts it).

Parameter counts (10 classes): ``cnn`` 424,266; ``mcmahan_cnn`` 1,663,370 (the count
given by McMahan et al. 2017); ``mlp`` 79,510.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.kernels import lane_conv


def conv2d_im2col(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  padding: tuple[int, int]) -> torch.Tensor:
    """A stride-1 convolution as patches times weights: ``unfold`` the ``(N, C, H, W)`` input into
    ``(N, C k_h k_w, L)`` columns and multiply by the ``(O, C k_h k_w)`` weight matrix. Equal to
    ``F.conv2d`` in exact arithmetic (another summation order); under ``vmap`` over lanes with a
    weight per lane the product is one batched matrix multiply (issue 37 item 4)."""
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    cols = F.unfold(x, (kh, kw), padding=padding)
    out_h, out_w = h + 2 * padding[0] - kh + 1, w + 2 * padding[1] - kw + 1
    out = (weight.reshape(o, -1) @ cols).reshape(n, o, out_h, out_w)
    return out if bias is None else out + bias[:, None, None]


class _MaxPool2ChannelsLast(torch.autograd.Function):
    """2x2 max-pooling of an ``(N, C, H, W)`` CPU activation whose forward scans a channels-last
    copy and whose backward is PyTorch's own, on the usual layout.

    PyTorch's CPU forward kernel for the contiguous layout is scalar: the two poolings of the
    McMahan CNN took 13.5 ms of a 55 ms training step (batch 64, one thread, ``torch.profiler``),
    several times what they take on a channels-last copy. Both kernels scan each window row by
    row and keep the first strict maximum, and the indices they return are the same spatial
    offsets, so values and indices are equal; the backward then scatters the gradient with
    those indices exactly as ``F.max_pool2d``'s does (the same kernel on the same contiguous
    tensors), and so does its double backward. The forward pays one copy of the input and two
    small ones of the outputs; pooling the channels-last copy through autograd instead also
    copies every gradient and made the whole step slower. The gradients are bit-identical to
    ``F.max_pool2d``'s (``tests/test_models.py``: tie-heavy input, double backward, ``vmap``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        channels_last = h.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        out, index = F.max_pool2d(channels_last, 2, return_indices=True)
        return out.contiguous(), index.contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0], output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _index_grad) -> torch.Tensor:
        h, index = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, h, [2, 2], [2, 2], [0, 0], [1, 1], False, index)


def max_pool2(h: torch.Tensor) -> torch.Tensor:
    """2x2 max-pooling (stride 2), equal to ``F.max_pool2d(h, 2)`` bit for bit in its values and
    gradients; on the CPU through :class:`_MaxPool2ChannelsLast` (2.5-3x faster there), on
    other devices ``F.max_pool2d`` itself."""
    if h.device.type != "cpu" or h.dim() != 4:
        return F.max_pool2d(h, 2)
    return _MaxPool2ChannelsLast.apply(h)[0]


def relu_max_pool2(h: torch.Tensor) -> torch.Tensor:
    """``max_pool2d(relu(h), 2)`` computed as ``relu(max_pool2(h))``: the same values (ReLU is
    monotone, so it commutes with a maximum) and the same gradients bit for bit. Where a
    window's maximum is positive, both send the gradient to its first maximal entry (the
    maxima of ``h`` and ``relu(h)`` are then the same entries); where it is not, both send
    zero. Pooling first runs ReLU and its backward on a quarter of the entries."""
    return F.relu(max_pool2(h))


class LaneConv2d(nn.Conv2d):
    """``nn.Conv2d`` (stride 1, integer padding, no groups or dilation: what the models use) that
    computes as :func:`fedlib.kernels.lane_conv` says: PyTorch's convolution (``grouped``, the
    default) or :func:`conv2d_im2col`. Same parameters and initialisation as ``nn.Conv2d``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if (self.stride != (1, 1) or self.dilation != (1, 1) or self.groups != 1
                or isinstance(self.padding, str)):
            raise ValueError("LaneConv2d supports stride 1, integer padding, no dilation or groups")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if lane_conv() == "im2col":
            return conv2d_im2col(x, self.weight, self.bias, self.padding)
        return super().forward(x)


class _CNN(nn.Module):
    """Shared forward: ``features`` -> ReLU(fc1) (the representation) -> [dropout] -> fc2.

    With ``proj_dim > 0`` a projection head (MLP ``repr -> repr -> proj_dim``, as in MOON,
    Li et al. CVPR 2021) maps the representation to the vector MOON contrasts; it does not
    feed the classifier.
    """

    repr_dim: int

    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.proj: nn.Module | None = None

    def _add_projection_head(self, proj_dim: int) -> None:
        """Created after the other layers, so the backbone's initialisation at a given seed
        is the same with or without the head."""
        if proj_dim:
            self.proj = nn.Sequential(nn.Linear(self.repr_dim, self.repr_dim), nn.ReLU(),
                                      nn.Linear(self.repr_dim, proj_dim))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # defined by each network below

    def forward(self, x: torch.Tensor, dropout_mask: torch.Tensor | None = None,
                return_repr: bool = False):
        rep = F.relu(self.fc1(self.features(x).flatten(1)))
        z = rep if dropout_mask is None else rep * dropout_mask / (1.0 - self.dropout)
        logits = self.fc2(z)
        if not return_repr:
            return logits
        return logits, (self.proj(rep) if self.proj is not None else rep)


class MoonDpapCNN(_CNN):
    """CNN of MOON-DPAP (Su, ICDSE 2025, Sec. 4.1): two conv layers, one max-pool, two
    fully connected layers, ReLU after each hidden layer, optional dropout.

    The paper gives no widths; we choose conv 1->16 (5x5), conv 16->32 (5x5), 2x2 max-pool,
    FC 3200->128 (the representation), FC 128->10 (the classifier). Dropout, when enabled,
    acts on the 128-d representation before the classifier.
    """

    repr_dim = 128

    def __init__(self, num_classes: int = 10, dropout: float = 0.0, proj_dim: int = 0):
        super().__init__(dropout)
        self.conv1 = LaneConv2d(1, 16, 5)
        self.conv2 = LaneConv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 10 * 10, self.repr_dim)
        self.fc2 = nn.Linear(self.repr_dim, num_classes)
        self._add_projection_head(proj_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """conv 5x5 -> ReLU -> conv 5x5 -> max-pool 2x2 -> ReLU (the paper's two convolutions, one pool)."""
        return relu_max_pool2(self.conv2(F.relu(self.conv1(x))))


class McMahanCNN(_CNN):
    """MNIST CNN of McMahan et al. (AISTATS 2017, Sec. 3): 5x5 conv 32 and 64 channels
    ('same' padding), each followed by 2x2 max-pooling, FC 512 with ReLU, softmax output;
    1,663,370 parameters. Used by FDL (Cheng)."""

    repr_dim = 512

    def __init__(self, num_classes: int = 10, dropout: float = 0.0, proj_dim: int = 0):
        super().__init__(dropout)
        self.conv1 = LaneConv2d(1, 32, 5, padding=2)
        self.conv2 = LaneConv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, self.repr_dim)
        self.fc2 = nn.Linear(self.repr_dim, num_classes)
        self._add_projection_head(proj_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Two rounds of conv 5x5 -> max-pool 2x2 -> ReLU (McMahan et al. 2017)."""
        return relu_max_pool2(self.conv2(relu_max_pool2(self.conv1(x))))


class MLP(_CNN):
    """A small fully connected network, 784 -> 100 (ReLU, the representation) -> 10;
    79,510 parameters. Our choice for the DP-FL chapter, whose article names no model:
    client-level DP noise grows with the square root of the parameter count, so a small
    model lets a CPU-sized federation (1,000 clients) show the whole privacy-accuracy curve."""

    repr_dim = 100

    def __init__(self, num_classes: int = 10, dropout: float = 0.0, proj_dim: int = 0):
        super().__init__(dropout)
        self.fc1 = nn.Linear(28 * 28, self.repr_dim)
        self.fc2 = nn.Linear(self.repr_dim, num_classes)
        self._add_projection_head(proj_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The image itself (flattened by the forward pass): an MLP has no feature extractor."""
        return x


#: The networks by name (``Config.model``).
MODEL_CLASSES: dict[str, type[nn.Module]] = {"cnn": MoonDpapCNN, "mcmahan_cnn": McMahanCNN, "mlp": MLP}


def build_model(name: str, num_classes: int = 10, dropout: float = 0.0, proj_dim: int = 0) -> nn.Module:
    """A fresh network by name (:data:`MODEL_CLASSES`: ``cnn``, ``mcmahan_cnn``, ``mlp``) with ``num_classes``
    outputs, dropout on its representation and, with ``proj_dim > 0``, MOON's projection head."""
    try:
        return MODEL_CLASSES[name](num_classes=num_classes, dropout=dropout, proj_dim=proj_dim)
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {list(MODEL_CLASSES)}") from None


def count_parameters(model: nn.Module) -> int:
    """The number of trainable numbers in ``model`` (its ``d``)."""
    return sum(p.numel() for p in model.parameters())
