"""`python -m ttp_lightning.verify certificate CERT [WEIGHTS ...] [--recompute] [--audit AUDIT] [data.KEY=VALUE ...]`
(or without `certificate`, as before): check a certified release's (epsilon, delta) certificate.

CERT is a release's certificate.json (or its folder); the weights are the files it names, next to it,
unless given. The certificate is untrusted input: it is read as typed data against an allowlist (no
_target_, no imports, no pickles; weights are safetensors), and a certificate outside the format ends in one
`error:` line. Checks: the weights' SHA-256; finite numbers; the theorems' hypotheses against the measured
values the certificate states (lambda > ||H||, lambda + lambda_min > 0, ||H|| within the stated Lipschitz
constants, lambda_min = min(stated, measured)); estimator depth, scale and residual (Algs 3-4); Delta from
the constants; epsilon, sigma and the mechanism over the releases that compose; the released weights' norm
against C plus the noise's norm. --recompute rebuilds the data and model from registered configs and
recomputes the forget confidence distance; --audit reruns the Newton step(s) from the provider's private
audit record, redraws the noise from its seed and compares the result with the release. Without --audit,
lambda and the provider's measurements at the noise-free weights (the residual, its multiplier, ||H||,
lambda_min) are checked only for consistency with each other: a line names each value taken on trust.

The certificate's folder must be a release (config.json beside certificate.json); one whose config.json says
"protected": false (its release gate failed) fails, and says so first, unless --allow-unprotected.

Exit status: 0 verified; 1 a check failed (one FAIL line each), or the release is not protected; 2 unusable or
hostile input; 3 verified but vacuous (epsilon above --vacuous-above, default 10, or delta not below 1/n for the
n training records: the certificate guarantees nothing meaningful).
"""

import argparse
import math
import re
from pathlib import Path
from types import SimpleNamespace

from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.certified.certificate.arithmetic import training_set_size
from ttp_lightning.certified.certificate.checks import check_certificate, vacuous_reasons
from ttp_lightning.certified.certificate.document import CERTIFICATE_FILE
from ttp_lightning.certified.certificate.format import check_audit_format, check_certificate_format
from ttp_lightning.certified.certificate.statement import guarantee_lines, trusted_line
from ttp_lightning.config.allowlist import strict_json
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.release import read_release_config
from ttp_lightning.release.load import architecture_of_release, check_size
from ttp_lightning.verify.audit import Mismatch, audit_failures, rebuild_model
from ttp_lightning.verify.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_VACUOUS,
    INPUT_ERRORS,
    cannot_verify,
    failed,
    unprotected_failures,
)

FORGET_CD_TOLERANCE = 1e-4
MAX_DOCUMENT_BYTES = 64 << 20
OVERRIDE = re.compile(r"^data\.[A-Za-z0-9_.]+=")


def read_json(path: Path) -> dict:
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{path} is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    return strict_json(path.read_text())


def recompute_failures(cert: dict, weights: Path, overrides: list[str]) -> list[str]:
    """Rebuild data and model from registered configs; the forget set's fingerprint and forget CD."""
    try:
        datamodule, net = rebuild_model(cert, weights, overrides)
    except Mismatch as exc:
        return [str(exc)]
    failures = []
    n = len(datamodule.dataset("forget")) + len(datamodule.dataset("retain"))
    if n != training_set_size(cert):
        failures.append(f"the rebuilt training set holds {n} records; the certificate's steps state "
                        f"{training_set_size(cert)} (its delta is judged against 1/n)")
    measured = evaluate(net, datamodule)["forget_conf_dist"]
    stated = cert["metrics"].get("forget_conf_dist")
    if not isinstance(stated, (int, float)) or not abs(measured - stated) <= FORGET_CD_TOLERANCE:
        failures.append(f"forget confidence distance recomputes to {measured:.6f}, the certificate says {stated}")
    return failures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("certificate", type=Path, help="release/certificate.json (or the release folder)")
    parser.add_argument("weights", type=Path, nargs="*", help="weights files, in the certificate's order "
                        "(default: the files it names, next to it)")
    parser.add_argument("--recompute", action="store_true", help="rebuild the data and recompute the forget CD")
    parser.add_argument("--audit", type=Path, metavar="AUDIT", help="private/audit.json: rerun the Newton "
                        "step(s), redraw the noise and compare with the release")
    parser.add_argument("--vacuous-above", type=float, default=10.0, metavar="EPS",
                        help="epsilon above this is reported as vacuous, exit 3 (default 10)")
    parser.add_argument("overrides", nargs="*", metavar="data.KEY=VALUE", help="data settings on this machine "
                        "for --recompute/--audit (e.g. data.root=DIR)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="relative tolerance of --audit's rerun (default 1e-4)")
    parser.add_argument("--allow-unprotected", action="store_true",
                        help='check a release whose config.json says "protected": false (its gate failed)')


def check_arguments(args) -> None:
    """verify's own settings, finite and in range (argparse reads 'nan' as a float)."""
    if not 0.0 < args.vacuous_above < float("inf"):
        raise TTPUserError(f"--vacuous-above={args.vacuous_above:g} is not allowed; choose a finite epsilon > 0")
    if not 0.0 < args.tolerance < 1.0:
        raise TTPUserError(f"--tolerance={args.tolerance:g} is not allowed; choose a value in (0, 1)")


def release_config(cert_path: Path) -> dict:
    """config.json of the release folder the certificate is in (a certificate is published as part of one)."""
    folder = cert_path.parent
    if not (folder / "config.json").is_file():
        raise TTPUserError(f"{str(folder)!r} holds no config.json beside {cert_path.name}; a certified release is "
                           "the whole release folder (certificate.json, config.json, the weights)")
    return read_release_config(folder)


def checked_certificate(args, cert_path: Path, overrides: list[str]) -> tuple[dict, dict, list[str], list[str]]:
    """(the certificate, its release's config.json, the failures, what was checked); raises on unusable input."""
    check_arguments(args)
    cert = check_certificate_format(read_json(cert_path))
    config = release_config(cert_path)
    weights = args.weights or [cert_path.parent / entry["file"] for entry in cert["weights"]]
    for path in weights:
        if not path.is_file():
            raise FileNotFoundError(f"weights file {path} does not exist")
    if config["architecture"] is not None:  # every weights file is the release's network: sized before hashed
        shapes = architecture_of_release(cert_path.parent, config)[2]
        for path in weights:
            check_size(path, sum(math.prod(shape) for shape in shapes.values()))
    failures = check_certificate(cert, weights)
    checked = ["weights SHA-256", "finite values", "hypotheses vs measured values", "Delta", "sigma/epsilon",
               "||w|| <= C + noise"]
    if args.recompute:
        failures += recompute_failures(cert, weights[-1], overrides)
        checked.append("forget set and forget CD recomputed")
    if args.audit:
        audit = check_audit_format(read_json(args.audit))
        failures += audit_failures(cert, cert_path, audit, args.audit.parent, weights, overrides, args.tolerance)
        checked.append("release reproduced from the audit record")
    return cert, config, failures, checked


def run(args) -> int:
    """`verify certificate`: exit 0 verified, 1 a check failed or the release is not protected, 2 unusable input, 3
    vacuous. `args.overrides`: the data.KEY=VALUE settings for --recompute / --audit."""
    from safetensors import SafetensorError

    cert_path = args.certificate / CERTIFICATE_FILE if args.certificate.is_dir() else args.certificate
    try:
        cert, config, failures, checked = checked_certificate(args, cert_path, args.overrides)
    except (*INPUT_ERRORS, SafetensorError) as exc:
        return cannot_verify(exc)
    release = SimpleNamespace(release=cert_path.parent, allow_unprotected=args.allow_unprotected)
    failures = unprotected_failures(release, config, "checks its certificate anyway") + failures  # said first
    if failed(failures):
        return EXIT_FAIL
    print(f"verified: {cert['algorithm']}, epsilon={cert['epsilon']:.6g}, delta={cert['delta']:.3g}, "
          f"sigma={cert['sigma']:.6g}, Delta={cert['sensitivity']:.6g} ({', '.join(checked)})")
    for line in guarantee_lines(cert):
        print(line)
    if not (args.recompute or args.audit):
        print("not checked without --recompute or --audit: that these weights came from this data (anyone can "
              "write a self-consistent certificate for any weights)")
    if not args.audit:
        print(trusted_line(cert))
    vacuous = vacuous_reasons(cert, args.vacuous_above)
    for reason in vacuous:
        print(f"VACUOUS: {reason}")
    return EXIT_VACUOUS if vacuous else EXIT_OK


DESCRIPTION, EPILOG = __doc__.split("\n\n")[0], __doc__.split("\n\n")[-1]
