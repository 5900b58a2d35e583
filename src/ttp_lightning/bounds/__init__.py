"""Interval bound propagation (propagate.py) and the proven uniformity it gives (uniformity.py): upper
bounds on a network's confidence anywhere in an L-inf ball around an image, from its weights alone."""

from ttp_lightning.bounds.propagate import (
           Box,
           UnsupportedLayer,
           interval_bounds,
           logit_difference_lower_bounds,
)
from ttp_lightning.bounds.uniformity import input_box, proven_conf_dist, reverse_kl_upper_bound

__all__ = [
           "Box",
           "UnsupportedLayer",
           "input_box",
           "interval_bounds",
           "logit_difference_lower_bounds",
           "proven_conf_dist",
           "reverse_kl_upper_bound",
]
