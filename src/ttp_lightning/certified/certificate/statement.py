"""What a certificate that passes the checks proves, and under which assumptions: the guarantee, what is assumed
and what measured, what it is conditional on, and the constants taken on trust without --audit."""

from ttp_lightning.certified.certificate.arithmetic import ESTIMATOR, EXACT, ONLINE, composed_releases
from ttp_lightning.certified.maths.residual import CONVEX_REDUCTION
from ttp_lightning.certified.maths.residual import EXACT as CONVEX_LOSSES


def guarantee_lines(cert: dict) -> list[str]:
    """What a certificate that passes the checks proves, and under which assumptions."""
    k = composed_releases(cert)
    target = ("the exact regularised Pareto optimum M_theta(D) noised the same way" if k == 1 else
              f"the {k} exact regularised Pareto optima after requests 1..{k}, noised the same way")
    layers = " (the final layer only, on the start model's frozen features)" if cert["layers"] == "last" else ""
    if cert["bound"] == "residual":
        how = (f"a-posteriori residual bound: Delta = max over steps of (||r|| + sqrt(||r||^2 + 4 mu nu ||w|| "
               f"(C - ||w||))) / (2 mu), mu={cert['mu']:.6g}")
    else:
        step = {EXACT: "exact Newton step (Alg 2)", ESTIMATOR: "Newton step with the inverse-Hessian estimator (Alg 3)",
                ONLINE: "online Newton steps (Alg 4)"}[cert["algorithm"]]
        how = (f"the paper's bound for the {step}: {cert['sensitivity_formula']:.6g}, capped at 2C = "
               f"{2 * cert['norm_bound']:.6g}")
    guarantee = (f"guarantee: the released weights{layers} ({k} release(s)) are (epsilon={cert['epsilon']:.6g}, "
                 f"delta={cert['delta']:.3g})-indistinguishable from {target}: theta={cert['theta']:.4g}, "
                 f"lambda={cert['lam']:.6g}, sigma={cert['sigma']:.6g}, Delta={cert['sensitivity']:.6g} "
                 f"({cert['mechanism']}; {how})")
    return [guarantee, _assumed_line(cert), _measured_line(cert)] + condition_lines(cert)


def _assumed_line(cert: dict) -> str:
    if cert["bound"] == "residual":
        if cert["mu_rule"] == CONVEX_LOSSES:
            convexity = (f"nothing assumed: cross-entropy and {cert['uniformity']} are convex in the logits, which are "
                         f"linear in the certified weights, so mu = lambda exactly")
        elif cert["mu_rule"] == CONVEX_REDUCTION:
            convexity = (f"nothing assumed: cross-entropy and {cert['uniformity']} are convex in the logits, which are "
                         f"linear in the certified weights, and the forget losses are combined by "
                         f"{_reduction_words(cert['forget_reduction'])}, convex and nondecreasing in each, so mu = "
                         f"lambda exactly")
        else:
            convexity = (f"assumed, not measured: the forget loss's Hessian norm is at most P_K="
                         f"{cert['grad_lipschitz_forget']:.4g} (Assumption 1), so mu = lambda - theta P_K")
        return (f"{convexity}; M_theta(D) is the minimiser over ||w|| <= C={cert['norm_bound']:.6g}; the protection "
                f"of D_f is that optimum's measured uniformity (forget CD), not part of the guarantee")
    return (f"assumed, not measured: gradient Lipschitz P_K={cert['grad_lipschitz_forget']:.4g}, "
            f"P_A={cert['grad_lipschitz_retain']:.4g}; Hessian Lipschitz F_K={cert['hessian_lipschitz_forget']:.4g}, "
            f"F_A={cert['hessian_lipschitz_retain']:.4g}; ||M_theta(D)|| <= C={cert['norm_bound']:.6g}")


def _reduction_words(reduction: dict) -> str:
    if reduction["name"] == "smoothmax":
        return f"a smooth maximum at temperature {reduction['temperature']:.4g}"
    if reduction["name"] == "cvar":
        return (f"a smoothed CVaR of the largest {reduction['fraction']:.4g} at temperature "
                f"{reduction['temperature']:.4g}")
    return reduction["name"]


def _measured_line(cert: dict) -> str:
    steps = cert["steps"]
    if cert["bound"] == "residual":
        return (f"measured by the provider at the noise-free weights (checked here for consistency; --audit "
                f"remeasures): ||r||={max(s['stationarity'] for s in steps):.3g} plus a float64 rounding floor "
                f"{max(s['rounding_floor'] for s in steps):.3g}, nu={steps[-1]['multiplier']:.6g}, "
                f"||w||={steps[-1]['weights_norm']:.12g}")
    return (f"measured by the provider (checked here for consistency, not re-measured): lambda_min(H)="
            f"{min(s['lam_min_measured'] for s in steps):.6g} ({steps[0]['spectrum_method']}), "
            f"||H||={cert['hessian_norm']:.6g}, G={cert['gradient_bound']:.6g}, "
            f"residual={max(s['residual'] for s in steps):.3g}")


def trusted_line(cert: dict) -> str:
    """The constants no public check can re-measure (the weights are noised, the provider's measurements were made
    at the private noise-free weights, lambda is a setting the weights do not reveal): verify checks them for
    consistency with one another only, so a self-consistent edit of them (lambda = mu = 1 with Delta and sigma
    recomputed shrank Delta 100x) passes every check but --audit, which re-measures them."""
    steps = cert["steps"]
    if cert["bound"] == "residual":
        values = (f"lambda={cert['lam']:.6g} (and mu={cert['mu']:.6g} from it), ||r||="
                  f"{max(s['stationarity'] for s in steps):.3g}, rounding floor {max(s['rounding_floor'] for s in steps):.3g}, "
                  f"nu={steps[-1]['multiplier']:.6g}, ||w||={steps[-1]['weights_norm']:.12g}")
    else:
        values = (f"lambda={cert['lam']:.6g}, lambda_min(H)={min(s['lam_min_measured'] for s in steps):.6g}, "
                  f"||H||={cert['hessian_norm']:.6g}, G={cert['gradient_bound']:.6g}, "
                  f"residual={max(s['residual'] for s in steps):.3g}")
    return (f"taken on trust (only --audit re-measures them, at the private noise-free weights; Delta and sigma "
            f"follow from them): {values}")


def condition_lines(cert: dict) -> list[str]:
    """What the guarantee is conditional on beyond the stated constants: a Lanczos lambda_min is an estimate,
    not a bound (Ritz values lie above the true minimum)."""
    if cert["bound"] == "residual":
        return []
    lanczos = [i for i, step in enumerate(cert["steps"], 1) if step["spectrum_method"] == "lanczos"]
    if not lanczos:
        return []
    line = (f"conditional on: lambda_min(H) at step(s) {', '.join(map(str, lanczos[:10]))} being at least the "
            f"Lanczos estimate minus its margin: Ritz values lie above the true minimum, so a lower true "
            f"lambda_min makes Delta too small and the guarantee void")
    return [line]
