"""`python -m ttp_lightning.theory COMMAND ...`: the paper's closed-form helpers on the command line.

  theta-bound       the smallest theta of Cor. `lambda_large` that guarantees a uniformity bound epsilon
  uniformity-bound  Prop. `bound_on_pop_distance_between_output_and_unif` for a given theta
  noise             the Gaussian-mechanism sigma for a sensitivity Delta and an (epsilon, delta) budget,
                    over --releases k noised releases that compose (Alg 4 releasing every request)
Add --json for machine-readable output. Exit 0, or 2 with one line on bad input.
"""

import argparse
import json
import sys

from ttp_lightning.dp.mechanism import noise_sigma
from ttp_lightning.dp.sensitivity import theta_lower_bound, uniformity_bound


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; choose a positive integer")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; choose a value > 0")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; choose a value in (0, 1)")
    return value


def _classes(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; a classifier has at least 2 classes")
    return value


class OneLineErrors(argparse.ArgumentParser):
    """Bad input ends in one `error:` line naming the value (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}\n")


def parser() -> argparse.ArgumentParser:
    root = OneLineErrors(prog="python -m ttp_lightning.theory", description=__doc__.splitlines()[0])
    root.add_argument("--json", action="store_true", help="print one JSON object")
    commands = root.add_subparsers(dest="command", required=True)
    theta = commands.add_parser("theta-bound", help="theta >= 2|D_r| ln K / (epsilon^2 + 2|D_r| ln K)")
    theta.add_argument("--epsilon", type=_positive, required=True, help="target uniformity bound")
    uniform = commands.add_parser("uniformity-bound",
                                  help="||f(D_f) - uniform||_inf <= sqrt(2 (1 - theta) / theta |D_r| ln K)")
    uniform.add_argument("--theta", type=_fraction, required=True)
    for command in (theta, uniform):
        command.add_argument("--retain-size", type=_positive_int, required=True, help="|D_r|")
        command.add_argument("--classes", type=_classes, required=True, help="K")
    noise = commands.add_parser("noise", help="sigma for (Delta, epsilon, delta); epsilon >= 1: analytic Gaussian")
    noise.add_argument("--sensitivity", type=_positive, required=True, help="Delta")
    noise.add_argument("--epsilon", type=_positive, required=True)
    noise.add_argument("--delta", type=_fraction, required=True)
    noise.add_argument("--releases", type=_positive_int, default=1,
                       help="k releases with fresh noise that compose (default 1)")
    return root


def evaluate(args: argparse.Namespace) -> dict:
    if args.command == "theta-bound":
        return {"theta_lower_bound": theta_lower_bound(args.epsilon, args.retain_size, args.classes),
                "epsilon": args.epsilon, "retain_size": args.retain_size, "classes": args.classes}
    if args.command == "uniformity-bound":
        return {"uniformity_bound": uniformity_bound(args.theta, args.retain_size, args.classes),
                "theta": args.theta, "retain_size": args.retain_size, "classes": args.classes}
    sigma, mechanism = noise_sigma(args.sensitivity, args.epsilon, args.delta, args.releases)
    return {"sigma": sigma, "mechanism": mechanism, "sensitivity": args.sensitivity, "epsilon": args.epsilon,
            "delta": args.delta, "releases": args.releases}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = evaluate(args)
    if args.json:
        print(json.dumps(result))
    else:
        name, value = next(iter(result.items()))
        rest = ", ".join(f"{k}={v}" for k, v in list(result.items())[1:])
        print(f"{name} = {value:.6g}  ({rest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
