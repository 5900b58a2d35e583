"""The explicit Hessian of the regularised Pareto objective, for models small enough to hold it (Alg 2)."""

import torch

from ttp_lightning.certify.hvp import ParetoCurvature, flatten, unflatten
from ttp_lightning.errors import TTPUserError


def exact_hessian(curv: ParetoCurvature, max_params: int, directions_per_pass: int = 512) -> torch.Tensor:
    """H + lambda I as a dense (p, p) matrix: reverse-over-reverse per data chunk, `directions_per_pass`
    Hessian rows at a time. Refuses above `max_params` instead of running out of memory."""
    size = sum(p.numel() for p in curv.params)
    if size > max_params:
        raise TTPUserError(
            f"the exact Hessian has {size:,} x {size:,} entries (model has {size:,} parameters, more than "
            f"method.max_exact_params={max_params:,}); use method=certified_lissa or raise the limit"
        )
    names = [name for name, p in curv.net.named_parameters() if p.requires_grad]
    weights = flatten(p.detach() for p in curv.params)
    hessian = curv.lam * torch.eye(size, dtype=weights.dtype, device=weights.device)
    for dataset, loss_fn, weight in curv._weighted_terms():
        if not weight:
            continue

        def chunk_hessian(images, labels, loss_fn=loss_fn):
            def loss_sum(flat):
                state = dict(zip(names, unflatten(flat, curv.params)))
                return loss_fn(torch.func.functional_call(curv.net, state, (images,)), labels) * len(labels)

            return torch.func.jacrev(torch.func.jacrev(loss_sum), chunk_size=directions_per_pass)(weights)

        hessian += weight * curv.part_sum(dataset, chunk_hessian) / len(dataset)
    return hessian
