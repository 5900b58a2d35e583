"""What an attack is: one YAML in conf/attacks/suite/ whose `_target_` names an Attack subclass, plus that class.

`attacks.suite` (conf/attacks/*.yaml) lists the attacks a run uses, each built by Hydra from its YAML;
`+attacks/suite@attacks.suite.NAME=NAME` adds one, `attacks.suite.NAME=null` leaves one out. The evaluation
(suite.py) calls every attack per chunk of forget images and radius, each free to start from the most
confident point found so far, and keeps per image the most confident point of all.
"""

import torch
from torch import nn

# a max softmax this close to 1 cannot be raised by more than it: an attack may stop there (results.json
# rounds a CD to 6 decimals)
SATURATED = 1e-6


def saturated(confidence: torch.Tensor) -> torch.Tensor:
    """Per row: the max softmax is within SATURATED of 1 (NaN is not)."""
    return confidence >= 1 - SATURATED


class Attack:
    """Base class. `random`: it draws noise and reads no gradient (left out of the unbounded check and of the
    drop check on mean curves); `own_surrogates`: it chooses its ReLU surrogates itself (attacks.surrogate_betas),
    the others run under attacks.relu_gradient_beta."""

    random: bool = False
    own_surrogates: bool = False

    def keeps_start(self, cfg) -> bool:
        """Whether its point is never less confident than `warm_start` under these settings (then an image
        whose warm start is saturated need not be attacked)."""
        return False

    def __call__(self, model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator, cfg, *,
                 targets: torch.Tensor, warm_start: torch.Tensor | None = None, samples: int = 1) -> torch.Tensor:
        """Images within the L-inf ball of radius `gamma` around `images` (Gaussian noise: standard deviation
        `gamma`), in [0, 1]; `cfg` holds the evaluation's shared settings (conf/attacks)."""
        raise NotImplementedError(f"{type(self).__name__}.__call__")
