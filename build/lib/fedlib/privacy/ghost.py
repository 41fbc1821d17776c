"""Record-level DP-SGD's clipped sum without every per-sample gradient ("ghost" clipping).

:func:`fedlib.privacy.dpsgd.private_grad` materialises one gradient per sample (``vmap`` of
``grad``): for the MOON-DPAP CNN that is 424,266 numbers per sample, 97 % of them in ``fc1``, and a
step costs about ten plain steps. The clipped sum ``sum_b c_b grad l_b`` needs much less:

* For a linear layer ``y = a W^T + b`` the per-sample gradient is the outer product
  ``g_b a_b^T`` with ``g_b = dl_b / dy_b``, so its norm is ``||g_b|| ||a_b||`` (Goodfellow, 2015,
  "Efficient per-example gradient computations") and the clipped sum is one matrix product,
  ``(c * G)^T A`` (the "book-keeping" of Bu et al., ICML 2023: the activations and output
  gradients of one backward pass are reused, no second backward pass).
* A convolution's per-sample gradient is a correlation of the sample's input with its output
  gradients; the conv layers hold few parameters, so those are materialised (the weight gradient
  of one grouped convolution, the samples as groups).

The output gradients ``g_b`` of every layer come from one backward pass of the batch loss with
respect to zero perturbations added to the layers' outputs (forward hooks); since sample ``b``'s
loss depends only on its own outputs, the gradient of the batch loss at ``y_b`` is ``dl_b / dy_b``
times the loss's weight of ``b``. Everything is ``torch.func``, so it runs inside the engine's
``vmap`` over clients like the per-sample path.

The result is the same sum as the per-sample path (equal in float64 to rounding; tested to 1e-10
relative) with the same privacy argument: each sample's contribution ``c_b g_b a_b^T`` has norm
``min(||grad l_b||, C)``, a sample whose gradient has a non-finite coordinate contributes nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.func import grad_and_value

from fedlib.privacy.dpsgd import clip_scale

Params = dict[str, torch.Tensor]
SUPPORTED = (nn.Linear, nn.Conv2d)

#: model -> {(layers, parameter and batch shapes): each layer's output shape}; weak, so a freed model's
#: entry goes with it (an ``id()`` key was reused by the next model and returned stale shapes)
_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layers_of(model: nn.Module, params: Params) -> dict[str, nn.Module]:
    """The layer that owns each parameter; a clear error for a parameter ghost clipping cannot
    handle (anything but the weight and bias of an ``nn.Linear`` or an ungrouped, zero-padded
    ``nn.Conv2d`` with integer padding)."""
    modules = dict(model.named_modules())
    layers: dict[str, nn.Module] = {}
    for name in params:
        owner, _, leaf = name.rpartition(".")
        module = modules.get(owner)
        if not isinstance(module, SUPPORTED) or leaf not in ("weight", "bias"):
            raise ValueError(f"ghost clipping handles the weights and biases of nn.Linear and nn.Conv2d; "
                             f"parameter {name!r} belongs to {type(module).__name__}: use dp_grad=per_sample")
        if isinstance(module, nn.Conv2d) and (module.groups != 1 or isinstance(module.padding, str)
                                              or module.padding_mode != "zeros"):
            raise ValueError(f"ghost clipping handles ungrouped, zero-padded convolutions with integer "
                             f"padding; {owner!r} is not one: use dp_grad=per_sample")
        layers[owner] = module
    return layers


def _capture(layers: dict[str, nn.Module], hook: Callable) -> list:
    return [m.register_forward_hook(lambda mod, inp, out, n=n: hook(n, inp, out)) for n, m in layers.items()]


def _output_shapes(model: nn.Module, layers: dict[str, nn.Module], loss: Callable, params: Params,
                   batch: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Each layer's output shape in ``loss(params, batch)``: the loss evaluated once on the meta device
    (no arithmetic) per model and batch shape; inside ``vmap`` the shapes are the per-client ones."""
    key = (tuple(layers), tuple((k, tuple(v.shape)) for k, v in params.items()),
           tuple((k, tuple(v.shape), v.dtype) for k, v in batch.items()))
    cache = _SHAPES.setdefault(model, {})
    if key not in cache:
        shapes: dict[str, tuple[int, ...]] = {}

        def record(name, inputs, output):
            shapes[name] = tuple(output.shape)

        def meta(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(t.shape, dtype=t.dtype, device="meta")

        handles = _capture(layers, record)
        try:
            loss({k: meta(v) for k, v in params.items()}, {k: meta(v) for k, v in batch.items()})
        finally:
            for h in handles:
                h.remove()
        cache[key] = shapes
    return cache[key]


def _per_sample_conv(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per-sample weight gradients of a convolution (B x C_out x C_in x kh x kw):
    ``W_b[o, i] = sum_t g_b[o, t] a_b[i, stride t + dilation k]``, a correlation of each sample's input
    with its own output gradients. Computed as the weight gradient of one grouped convolution whose
    groups are the samples (one image of ``B C_in`` channels, ``B C_out`` outputs): PyTorch's own
    convolution backward-weights kernel (``torch.nn.grad.conv2d_weight``).

    Measured once on the 2-core CPU (one thread, batch 32, also under ``vmap`` over lanes; ``make
    bench`` times the whole DP-SGD step): 2.9x faster than a grouped forward convolution of the inputs
    with the output gradients as kernels (what an earlier version computed) for the 16-to-32-channel
    layer of the MOON-DPAP CNN, 2.3x for the McMahan CNN's 32-to-64, 3-6x faster than ``unfold`` and a
    batched matrix product; level (within 0.1-0.4 ms) for one-channel first layers."""
    batch, c_in = a.shape[:2]
    c_out = g.shape[1]
    kh, kw = layer.kernel_size
    grads = torch.nn.grad.conv2d_weight(a.reshape(1, batch * c_in, *a.shape[2:]),
                                        (batch * c_out, c_in, kh, kw),
                                        g.reshape(1, batch * c_out, *g.shape[2:]), stride=layer.stride,
                                        padding=layer.padding, dilation=layer.dilation, groups=batch)
    return grads.reshape(batch, c_out, c_in, kh, kw)


def ghost_clipped_sum(model: nn.Module, loss: Callable[[Params, dict], torch.Tensor], params: Params,
                      batch: dict[str, torch.Tensor], clip: float,
                      weight: torch.Tensor) -> tuple[Params, torch.Tensor, torch.Tensor]:
    """``sum_b weight_b clip(grad l_b, C)``, each sample's gradient norm before clipping, and the
    loss. ``loss(params, batch)`` must be the weighted mean ``sum_b w_b l_b / max(sum_b w_b, 1)`` of
    per-sample losses that each depend on their own sample only (every algorithm's loss), and must
    call ``model`` once (through ``functional_call``)."""
    layers = layers_of(model, params)
    shapes = _output_shapes(model, layers, loss, params, batch)
    zero = next(iter(params.values()))
    perturb = {n: torch.zeros(s, dtype=zero.dtype, device=zero.device) for n, s in shapes.items()}

    def perturbed_loss(eps: dict[str, torch.Tensor]):
        acts: dict[str, torch.Tensor] = {}

        def add(name, inputs, output):
            if name in acts:
                raise RuntimeError(f"ghost clipping needs each layer called once per forward; {name!r} "
                                   "was called twice")
            acts[name] = inputs[0]
            return output + eps[name]

        handles = _capture(layers, add)
        try:
            value = loss(params, batch)
        finally:
            for h in handles:
                h.remove()
        return value, acts

    out_grads, (value, acts) = grad_and_value(perturbed_loss, has_aux=True)(perturb)
    w = batch["w"]
    total = w.sum().clamp_min(1.0).to(zero.dtype)  # the loss's denominator: g_b = total * dloss/dy_b

    grads_out = {n: g * total for n, g in out_grads.items()}  # g_b = dl_b / dy_b

    # each tensor's per-sample gradient norm; per-sample gradients materialised only for convolutions
    per_sample: dict[str, torch.Tensor] = {}  # B x parameter shape
    norms: dict[str, torch.Tensor] = {}
    for n, layer in layers.items():
        a, g = acts[n], grads_out[n]
        if isinstance(layer, nn.Linear) and a.dim() == 2:  # ||g_b a_b^T|| = ||g_b|| ||a_b||
            norms[f"{n}.weight"] = torch.linalg.vector_norm(g, dim=1) * torch.linalg.vector_norm(a, dim=1)
        elif isinstance(layer, nn.Linear):  # a sequence of inputs per sample: materialise
            per_sample[f"{n}.weight"] = torch.einsum("b...o,b...i->boi", g, a)
        else:
            per_sample[f"{n}.weight"] = _per_sample_conv(layer, a, g)
        if f"{n}.bias" in params:
            per_sample[f"{n}.bias"] = g.flatten(2).sum(2) if g.dim() > 2 else g
    for k, v in per_sample.items():
        norms[k] = torch.linalg.vector_norm(v.flatten(1), dim=1)
    missing = [k for k in params if k not in norms]
    if missing:
        raise RuntimeError(f"ghost clipping found no per-sample gradient for {missing}")
    per_tensor = torch.stack([norms[k] for k in params], dim=1)
    # a per-sample gradient with a non-finite coordinate has a non-finite norm (vector_norm scales, so
    # a finite gradient's norm overflows only beyond the dtype's range, where its clip factor is 0
    # anyway): such a sample counts as zero, as on the per-sample path
    finite = torch.isfinite(per_tensor).all(1)
    total_norm = torch.linalg.vector_norm(torch.where(finite[:, None], per_tensor, 0.0), dim=1)
    total_norm = total_norm.to(weight.dtype)
    scale = clip_scale(total_norm, clip, weight)

    def rows(x: torch.Tensor) -> torch.Tensor:  # zero the samples that count as zero (0 * inf is NaN)
        return torch.where(finite.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros_like(x))

    summed: Params = {}
    for n in layers:
        key = f"{n}.weight"
        if key in per_sample:
            summed[key] = torch.tensordot(scale.to(per_sample[key].dtype), rows(per_sample[key]), dims=1)
        else:  # book-keeping: (c * G)^T A, one matrix product
            g, a = rows(grads_out[n]), rows(acts[n])
            summed[key] = (g * scale.to(g.dtype)[:, None]).T @ a
        if f"{n}.bias" in params:
            b = rows(per_sample[f"{n}.bias"])
            summed[f"{n}.bias"] = torch.tensordot(scale.to(b.dtype), b, dims=1)
    return {k: summed[k] for k in params}, total_norm, value


def private_grad_ghost(model: nn.Module, loss: Callable[[Params, dict], torch.Tensor], params: Params,
                       batch: dict[str, torch.Tensor], clip: float, expected_batch: float,
                       noise: Params) -> tuple[Params, torch.Tensor]:
    """:func:`fedlib.privacy.dpsgd.private_grad` (same arguments and result: DP-SGD's gradient of one
    step and the mean loss of the real samples) with the clipped sum of :func:`ghost_clipped_sum`;
    ``loss`` takes the whole batch (see there) instead of one sample."""
    if not clip > 0 or not expected_batch > 0:
        raise ValueError(f"need clip > 0 and expected_batch > 0, got {clip}, {expected_batch}")
    sample = {k: v for k, v in batch.items() if k != "noise"}
    summed, _, value = ghost_clipped_sum(model, loss, params, sample, clip, sample["w"])
    return {k: (summed[k] + noise[k]) / expected_batch for k in summed}, value
