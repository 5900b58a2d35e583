"""Train / eval mode of a network, switched for a block and restored module by module; the parameters a step trains.

`net.train(was_training)` after `net.eval()` is not a restore: it sets EVERY submodule to `was_training`, so a
BatchNorm layer that was deliberately in eval mode inside a training step (robust Alg 1 passes the forget images
through the running statistics) comes back in training mode, normalises the next forward pass by that batch's
statistics and updates its running statistics with them.
"""

import contextlib

from torch import nn


@contextlib.contextmanager
def evaluating(net: nn.Module):
    """Inside the block every module of `net` is in eval mode; afterwards each has its own earlier mode again."""
    modes = [(module, module.training) for module in net.modules()]
    net.eval()
    try:
        yield net
    finally:
        for module, training in modes:
            module.training = training


@contextlib.contextmanager
def batchnorm_in_eval_mode(net: nn.Module, active: bool = True):
    """Inside the block every BatchNorm layer of `net` uses (and does not update) its running statistics."""
    layers = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training] \
        if active else []
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer.train()


def trainable(net: nn.Module) -> list[nn.Parameter]:
    """The parameters a step trains (requires_grad), in the order net.parameters() gives them."""
    return [p for p in net.parameters() if p.requires_grad]
