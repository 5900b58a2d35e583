"""The explicit Hessian of the regularised Pareto objective, for models small enough to hold it (Alg 2)."""

import torch
from torch import nn

from ttp_lightning.certified.maths.hvp import ParetoCurvature, all_reduce, flatten, unflatten
from ttp_lightning.core.errors import TTPUserError


def exact_hessian(curv: ParetoCurvature, max_params: int, directions_per_pass: int = 512) -> torch.Tensor:
    """H + lambda I as a dense (p, p) matrix. Refuses above `max_params` instead of running out of memory.

    A model whose only trainable layer is its final nn.Linear (logistic regression) takes the Kronecker
    path, exact for such models and ~10x faster; any other model takes reverse-over-reverse autodiff per
    data chunk, `directions_per_pass` Hessian rows at a time. Sharded curvature sums each DDP rank's chunks
    and all-reduces, so every rank holds the same matrix.
    """
    size = sum(p.numel() for p in curv.params)
    if size > max_params:
        raise TTPUserError(
            f"the exact Hessian has {size:,} x {size:,} entries (model has {size:,} parameters, more than "
            f"method.max_exact_params={max_params:,}); use method=certified_lissa or raise the limit"
        )
    head = _sole_trainable_linear(curv.net, curv.params)
    if head is not None:
        return _affine_model_hessian(curv, head)
    names = curv.names
    weights = flatten(p.detach() for p in curv.params)
    hessian = curv.lam * torch.eye(size, dtype=weights.dtype, device=weights.device)
    for dataset, loss_fn, weight in curv.weighted_terms():
        if not weight:
            continue

        def chunk_hessian(images, labels, loss_fn=loss_fn):
            def loss_sum(flat):
                state = dict(zip(names, unflatten(flat, curv.params)))
                return loss_fn(torch.func.functional_call(curv.net, state, (images,)), labels) * len(labels)

            return torch.func.jacrev(torch.func.jacrev(loss_sum), chunk_size=directions_per_pass)(weights)

        hessian += weight * curv.part_sum(dataset, chunk_hessian) / len(dataset)
    return hessian


def _sole_trainable_linear(net: nn.Module, params: list[torch.Tensor]) -> nn.Linear | None:
    """The final nn.Linear when it holds every trainable parameter (weight, then bias), else None."""
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if len(linears) != 1 or linears[-1].bias is None:
        return None
    head = linears[0]
    if [id(p) for p in params] != [id(head.weight), id(head.bias)]:
        return None
    return head


def _affine_model_hessian(curv: ParetoCurvature, head: nn.Linear) -> torch.Tensor:
    """logits = W phi(x) + b with phi parameter-free: H = sum_i c_i M_i (x) [phi_i; 1][phi_i; 1]^T, with
    M_i the Hessian of instance i's loss with respect to its logits and c_i its weight in the objective.
    Built as K(K+1)/2 symmetric class-pair blocks, then laid out in (weight, bias) parameter order."""
    classes, features = head.weight.shape
    blocks = torch.zeros(classes, classes, features + 1, features + 1, dtype=curv.dtype, device=curv.device)
    captured = {}
    hook = head.register_forward_hook(lambda module, inputs, output: captured.update(phi=inputs[0]))
    try:
        for dataset, loss_fn, weight in curv.weighted_terms():
            if not weight:
                continue
            instance_loss = lambda z, y, loss_fn=loss_fn: loss_fn(z.unsqueeze(0), y.unsqueeze(0))
            logit_hessian = torch.func.vmap(torch.func.hessian(instance_loss))
            for images, labels in curv.shard(dataset):
                with torch.no_grad():
                    logits = curv.net(images)
                phi = torch.cat([captured["phi"], torch.ones_like(captured["phi"][:, :1])], dim=1)
                curvature = logit_hessian(logits, labels) * (weight / len(dataset))
                for a in range(classes):
                    for b in range(a, classes):
                        blocks[a, b] += (phi * curvature[:, a, b, None]).T @ phi
    finally:
        hook.remove()
    if curv.sharded:
        all_reduce(blocks)
    for a in range(classes):
        for b in range(a):
            blocks[a, b] = blocks[b, a].T
    size = classes * (features + 1)
    hessian = torch.zeros(size, size, dtype=curv.dtype, device=curv.device)
    w_rows = slice(0, classes * features)
    # weight-weight, weight-bias and bias-bias parts of every class pair
    hessian[w_rows, w_rows] = blocks[:, :, :features, :features].permute(0, 2, 1, 3).reshape(
        classes * features, classes * features)
    hessian[w_rows, classes * features:] = blocks[:, :, :features, features].permute(0, 2, 1).reshape(
        classes * features, classes)
    hessian[classes * features:, w_rows] = hessian[w_rows, classes * features:].T
    hessian[classes * features:, classes * features:] = blocks[:, :, features, features]
    return hessian + curv.lam * torch.eye(size, dtype=curv.dtype, device=curv.device)
