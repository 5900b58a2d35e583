"""The certified learners (Algs 2-4) as one Method: `method.algorithm` (set by conf/method/certified_*.yaml)
chooses how the Newton step is solved, and all three share one procedure (common.py):

- alg2_exact_newton (certified_exact): one Newton step to the regularised Pareto optimum with the explicit
  Hessian (Cholesky, float64; its exact spectrum gives lambda_min and ||H||), then Gaussian noise calibrated to
  the step's sensitivity Delta (eq. `algo_exact_hessian_eq`);
- alg3_hessian_estimator (certified_lissa): the Newton step with the stochastic inverse-Hessian estimator of
  Thm. `asymptotically_unbiased_estimator` (Hessian-vector products only; lambda_min and ||H|| by Lanczos);
- alg4_online (certified_online): forget requests D_{f_1}, ..., D_{f_k} one after another, one estimated
  Newton step each, w~_i = Pi(w~_{i-1} - P_n / J) at w~_{i-1} on (D_{f_i}, D_{r_i}); D_{f_i} is every instance
  requested so far and D_{r_i} the rest (App. "Online Algorithm"). `method.release=each` releases the model
  after every request with fresh noise (the k releases compose: sigma is calibrated so that all k together
  are (epsilon, delta)-indistinguishable from the k exact Pareto optima, dp/mechanism.py); `final`
  releases only w-_k (the paper's Alg 4; Prop. `bound_sequential`). Never sigma = Delta / (k epsilon), the
  paper's formula, which understates epsilon (docs/certified.md, the erratum).
"""

from torch import nn

from ttp_lightning.certified.certificate.arithmetic import ONLINE, delta_allowed
from ttp_lightning.certified.common import run_certified
from ttp_lightning.certified.maths.newton import resolve_lam
from ttp_lightning.certified.schema import CertifiedSchema
from ttp_lightning.config.schema import MainSchema
from ttp_lightning.core import checks
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput


class Certified(Method):
    """A certified learner; `settings.algorithm` picks how the Newton step is solved."""

    def __init__(self, settings: CertifiedSchema):
        super().__init__(settings)
        self.algorithm = str(settings.algorithm)

    def check(self, settings: MainSchema) -> None:
        check_certified(settings, online=self.algorithm == ONLINE)

    def check_data(self, datamodule) -> None:
        """delta < 1/n for the n records of D (forget plus retain): the certificate protects each of them."""
        n = len(datamodule.dataset("forget")) + len(datamodule.dataset("retain"))
        delta = float(self.settings.delta)
        if not delta_allowed(delta, n):
            raise TTPUserError(f"method.delta={delta:g} is not allowed; with n = {n} training records choose a delta "
                               f"in (0, 1/n = {1.0 / n:.3g}) (the paper's 1e-5 is below 1/60,000; a delta of 1/n or "
                               "more is met by publishing one record at random)")

    def run(self, ctx, pretrained: nn.Module, datamodule, make_net) -> MethodOutput:
        return run_certified(ctx, self.settings, pretrained, datamodule, self.algorithm)


CHECKPOINT_WHY = "A(D) must be trained here, under the weight-norm bound C the certificate assumes"
IMAGES_WHY = "a verifier rebuilds D_f from the data set's own indices"
IMAGEFOLDER_WHY = "a verifier rebuilds the data from a registered data set and its settings"


def check_certified(cfg: MainSchema, online: bool) -> None:
    """What the typed schema (certified/schema.CertifiedSchema: types, choices, ranges) cannot say: the settings
    of Algs 2-4 that depend on other settings (`online`: Alg 4)."""
    method = cfg.method
    unsupported = (
        ("model.checkpoint", cfg.model.get("checkpoint"), CHECKPOINT_WHY),
        ("data.forget.images", cfg.data.forget.images, IMAGES_WHY),
        ("data", "imagefolder" if cfg.data.name == "imagefolder" else None, IMAGEFOLDER_WHY),
        ("data.mean", cfg.data.mean, IMAGEFOLDER_WHY), ("data.std", cfg.data.std, IMAGEFOLDER_WHY),
    )
    for key, value, why in unsupported:
        if value:
            raise TTPUserError(f"{key}={value} is not supported with method={method.name} ({why}); use "
                               "method=pareto, or a built-in data set and pretraining")
    if cfg.pretrain.norm_bound is None:
        raise TTPUserError(f"method={method.name} needs pretrain.norm_bound (C, the weight-norm bound); e.g. 10")
    if method.bound == "residual" and cfg.pretrain.projection != "global":
        raise TTPUserError(f"pretrain.projection={cfg.pretrain.projection} is not supported with method.bound=residual "
                           f"(the solver keeps the certified weights in one C-ball); use pretrain.projection=global")
    lam = resolve_lam(method)
    if lam + checks.number(method.lam_min, "method.lam_min") <= 0:
        raise TTPUserError(f"method.lam_min={method.lam_min} is not allowed with lambda={lam}; "
                           f"lambda + lambda_min must be > 0")
    if online:
        if method.warmup_epochs:
            raise TTPUserError(f"method.warmup_epochs={method.warmup_epochs} is not allowed for certified_online "
                               f"(the online algorithm starts from A(D)); use 0")
        if not cfg.data.forget.requests:
            raise TTPUserError("method=certified_online needs data.forget.requests, a list of sizes or index "
                               "files, e.g. data.forget.requests=[50,50]")
