"""The baselines' typed settings, registered by the package's `__init__` under their methods' names."""

from dataclasses import dataclass

from ttp_lightning.config.schema import MethodSchema
from ttp_lightning.core import checks
from ttp_lightning.core.errors import TTPUserError


@dataclass
class RetrainSchema(MethodSchema):
    pass


@dataclass
class SyntheticSchema(MethodSchema):
    k: int = 500
    radius: float = 8.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks.positive_int(self.k, "method.k")
        checks.positive(self.radius, "method.radius")


@dataclass
class LabelDPSchema(MethodSchema):
    epsilon: float = 2.0
    stage_fraction: float = 0.5
    temperature: float = 1.0
    mixup_alpha: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks.positive(self.epsilon, "method.epsilon")
        fraction = checks.number(self.stage_fraction, "method.stage_fraction")
        if not 0.0 < fraction < 1.0:
            raise TTPUserError(f"method.stage_fraction={fraction} is not allowed; choose a value in (0, 1)")
        checks.positive(self.temperature, "method.temperature")
        checks.at_least_zero(self.mixup_alpha, "method.mixup_alpha")


@dataclass
class GaussianUniformSchema(MethodSchema):
    noise_variance: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        checks.positive(self.noise_variance, "method.noise_variance")


SCHEMAS = {"retrain": RetrainSchema, "synthetic": SyntheticSchema, "labeldp": LabelDPSchema,
           "gaussian_uniform": GaussianUniformSchema}
