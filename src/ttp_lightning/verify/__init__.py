"""`python -m ttp_lightning.verify certificate | robust | attack ...`: re-check a release from its own files, as an
auditor, a data subject or its provider would. Every input is untrusted; the verdicts are the checker's own,
recomputed, never read from the folder, and NaN never passes.

  certificate  a certified release's (epsilon, delta) certificate (Algs 2-4): verify/certificate.py
  robust       a bound on the CD of given images within a radius, from the weights alone: verify/robust.py
  attack       an attack on given images from seeds of your choosing: verify/attack.py

`python -m ttp_lightning.verify RELEASE ...` without a command is `certificate`, as before the commands existed.
Exit status: 0 verified; 1 a check failed (one FAIL line each); 2 unusable or hostile input; 3 (certificate)
verified but vacuous.
"""

import argparse
import sys

from ttp_lightning.verify import attack, certificate, robust
from ttp_lightning.verify.common import EXIT_UNUSABLE

COMMANDS = {"certificate": certificate, "robust": robust, "attack": attack}
SUMMARIES = {"certificate": "a certified release's (epsilon, delta) certificate (Algs 2-4)",
             "robust": "a bound on the CD of images within a radius, from the weights alone",
             "attack": "an attack on images from seeds of your choosing"}


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per verifier, each with its own arguments and help."""
    top = argparse.ArgumentParser(prog="python -m ttp_lightning.verify", description=__doc__.split("\n\n")[0],
                                  epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                  formatter_class=argparse.RawTextHelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="{certificate,robust,attack}")
    for name, module in COMMANDS.items():
        command = commands.add_parser(name, help=SUMMARIES[name], description=module.DESCRIPTION,
                                      epilog=module.EPILOG, formatter_class=argparse.RawTextHelpFormatter)
        module.add_arguments(command)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand `argv` names (certificate when it names none); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["certificate", *argv]  # the form before the commands existed
    if not argv or argv[0] in ("-h", "--help"):
        parser().print_help()
        return 0 if argv else EXIT_UNUSABLE
    overrides = [a for a in argv[1:] if certificate.OVERRIDE.match(a)] if argv[0] == "certificate" else []
    args = parser().parse_args([a for a in argv if a not in overrides])
    args.overrides = overrides
    return COMMANDS[args.command].run(args)
