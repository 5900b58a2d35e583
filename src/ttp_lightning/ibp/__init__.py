"""Interval bound propagation (propagate.py) and the certified uniformity it gives (uniformity.py): upper
bounds on a network's confidence anywhere in an L-inf ball around an image, from its weights alone."""

from ttp_lightning.ibp.propagate import Box, UnsupportedLayer, interval_bounds, logit_difference_lower_bounds
from ttp_lightning.ibp.uniformity import certified_conf_dist, input_box, reverse_kl_upper_bound

__all__ = ["Box", "UnsupportedLayer", "certified_conf_dist", "input_box", "interval_bounds",
           "logit_difference_lower_bounds", "reverse_kl_upper_bound"]
