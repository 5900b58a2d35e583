"""ttp_lightning: test-time privacy for open-weight image classifiers (Lightning + Hydra)."""

import os as _os
import platform as _platform

# The same digits on every x86 CPU: torch's own kernels, MKL and oneDNN each pick a code path by the CPU (AVX2,
# AVX-512), and a path's rounding moves a fit's numbers (the default job's kept epoch moved between an AVX-512
# machine and an AVX2 one). These pin the AVX2 path, which x86 CPUs since 2015 run, unless set already; they
# take effect only where torch is imported after this package (the CLI, the tests). docs/getting-started.md.
if _platform.machine().lower() in ("x86_64", "amd64"):
    for _key, _value in (("ATEN_CPU_CAPABILITY", "avx2"), ("MKL_CBWR", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "AVX2")):
        _os.environ.setdefault(_key, _value)

from ttp_lightning.alg1.schema import ParetoSchema as _ParetoSchema
from ttp_lightning.certified.schema import CertifiedSchema as _CertifiedSchema
from ttp_lightning.config.naming import register as _register_resolvers
from ttp_lightning.config.schema import register as _register_schemas
from ttp_lightning.methods.baselines.schemas import SCHEMAS as _BASELINE_SCHEMAS
from ttp_lightning.version import __version__ as __version__

# the typed config schemas the YAML files name (group `schema`); the methods' own live beside them
_register_schemas({"pareto": _ParetoSchema, "certified": _CertifiedSchema, **_BASELINE_SCHEMAS})
_register_resolvers()  # ${ttp.model_name:...}: the default experiment name


def __getattr__(name: str):
    """`ttp_lightning.load_released(DIR)`, imported on first use (the CLI does not pay for torch here)."""
    if name == "load_released":
        from ttp_lightning.release import load_released

        return load_released
    raise AttributeError(f"module 'ttp_lightning' has no attribute {name!r}")
