"""Alg 4 (`certified_online`): forget requests D_{f_1}, ..., D_{f_k} arrive one after another; each moves the
weights by one estimated Newton step w~_i = Pi(w~_{i-1} - P_n / J) computed at w~_{i-1} on (D_{f_i}, D_{r_i}).

D_{f_i} is every instance requested so far (the union of requests 1..i) and D_{r_i} the rest, so a later
step keeps earlier requests uniform (App. "Online Algorithm" defines D_{r_i} = D minus that union).

What is released (`method.release`):
- `each` (default): the model after every request, w-_i = w~_i + N_i with fresh noise each time, as a provider
  answering requests one by one publishes them. The k releases compose: sigma is calibrated so that all k
  together are (epsilon, delta)-indistinguishable from the k exact Pareto optima (certify/mechanism.py).
- `final`: only w-_k, one noise draw at the end (the paper's Alg 4). One Gaussian release with sensitivity
  Delta (Prop. `bound_sequential`: the bound is identical in the online setting).
Never sigma = Delta / (k epsilon) ..., the paper's formula, which understates epsilon (README, erratum)."""

from ttp_lightning.certify.certificate import ONLINE
from ttp_lightning.methods.certified.base import Certified


class CertifiedOnline(Certified):
    """Alg 4: one estimated Newton step per forget request (method=certified_online)."""

    algorithm = ONLINE
