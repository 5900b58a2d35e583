"""A backward-only smooth surrogate for ReLU (BPDA-style, Athalye et al. 2018), against gradient masking.

A finetuned ReLU network can switch every hidden unit off on a forget image: the logits are then constant
near it and the exact input gradient is zero, so a gradient attack cannot move although a small step would
switch units on again. Inside `smooth_relu_gradients(beta)` every ReLU (the nn.ReLU module, F.relu,
torch.relu and Tensor.relu, in place or not) keeps its exact forward value but back-propagates the
derivative of softplus_beta, sigmoid(beta z): dead units still point the way to becoming active. The
attacked model's outputs, hence every reported score, are the real model's.

A torch function mode intercepts the calls, so architectures that call F.relu inside forward() are covered
as well as nn.ReLU modules, and nothing in the model is replaced.
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_RELUS = (F.relu, F.relu_, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)


class _ReLUWithSoftplusGradient(torch.autograd.Function):
    """relu(z) forward; backward sigmoid(beta z), the derivative of softplus_beta."""

    @staticmethod
    def forward(ctx, z, beta):
        ctx.save_for_backward(z)
        ctx.beta = beta
        return z.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return grad * torch.sigmoid(ctx.beta * z), None


class _SmoothReLUGradients(TorchFunctionMode):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = float(beta)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _RELUS:
            return _ReLUWithSoftplusGradient.apply(args[0], self.beta)
        return func(*args, **(kwargs or {}))


@contextmanager
def smooth_relu_gradients(beta: float | None):
    """Inside the block every ReLU back-propagates sigmoid(beta z); beta None: exact gradients."""
    if beta is None:
        yield
        return
    with _SmoothReLUGradients(beta):
        yield
