"""`python -m ttp_lightning.verify CERT WEIGHTS [--recompute] [data.KEY=VALUE ...]`: check a certificate.

Checks the weights' SHA-256, recomputes Delta from the stated constants and the sigma that (Delta,
epsilon, delta) require; with --recompute also rebuilds the data set (optionally with data.* overrides,
e.g. data.root=...), checks the forget-set fingerprint and recomputes the forget confidence distance.
Exit 0 when every check holds, 1 with one line per failed check, 2 on unusable input.
"""

import argparse
import json
import sys
from pathlib import Path

FORGET_CD_TOLERANCE = 1e-4


def recompute_failures(cert: dict, weights: Path, overrides: list[str]) -> list[str]:
    import torch
    from omegaconf import OmegaConf

    from ttp_lightning.data import build_datamodule
    from ttp_lightning.evaluation import evaluate
    from ttp_lightning.models import build_classifier

    data_cfg = OmegaConf.merge(OmegaConf.create(cert["data_config"]),
                               OmegaConf.from_dotlist([o.removeprefix("data.") for o in overrides]))
    datamodule = build_datamodule(data_cfg)
    failures = []
    if datamodule.forget_fingerprint() != cert["forget_fingerprint"]:
        failures.append("the rebuilt forget set differs from the certified one (fingerprint mismatch)")
    net = build_classifier(OmegaConf.create(cert["model_config"]), datamodule.info)
    net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    measured = evaluate(net, datamodule)["forget_conf_dist"]
    stated = cert["metrics"]["forget_conf_dist"]
    if abs(measured - stated) > FORGET_CD_TOLERANCE:
        failures.append(f"forget confidence distance recomputes to {measured:.6f}, the certificate says {stated:.6f}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.verify", description=__doc__.splitlines()[0])
    parser.add_argument("certificate", type=Path)
    parser.add_argument("weights", type=Path)
    parser.add_argument("--recompute", action="store_true", help="rebuild the data and recompute the forget CD")
    parser.add_argument("overrides", nargs="*", help="data.KEY=VALUE overrides for --recompute (e.g. data.root=...)")
    args = parser.parse_intermixed_args(argv)

    from ttp_lightning.certify.certificate import check_certificate
    from ttp_lightning.errors import TTPUserError

    try:
        cert = json.loads(args.certificate.read_text())
        if not args.weights.is_file():
            raise FileNotFoundError(f"weights file {args.weights} does not exist")
        failures = check_certificate(cert, args.weights)
        if args.recompute:
            failures += recompute_failures(cert, args.weights, args.overrides)
    except (OSError, json.JSONDecodeError, KeyError, TTPUserError) as exc:
        print(f"error: cannot verify: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(f"verified: {cert['algorithm']}, epsilon={cert['epsilon']:.6g} ({cert['mechanism']}), "
          f"delta={cert['delta']:.3g}, sigma={cert['sigma']:.6g}, Delta={cert['sensitivity']:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
