"""Methods applied to the pretrained model A(D). A method is one YAML in conf/method/ whose `_target_` names a
Method subclass (base.py) plus that class; Hydra builds it, so no registry lists them and nothing imports a
method that is not run: Alg 1 (pareto.py), the certified learners (certified/), the baselines (baselines/)."""

__all__ = ["Method", "MethodOutput"]


def __getattr__(name: str):
    """`Method` (base.py) and `MethodOutput` (output.py), imported on first use: the methods' schemas beside them
    are registered when the package is imported, and that must not load torch."""
    if name == "Method":
        from ttp_lightning.methods.base import Method

        return Method
    if name == "MethodOutput":
        from ttp_lightning.methods.output import MethodOutput

        return MethodOutput
    raise AttributeError(f"module 'ttp_lightning.methods' has no attribute {name!r}")
