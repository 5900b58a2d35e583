"""`python -m ttp_lightning.push RELEASE REPO_ID`: a release folder onto a model hub as a model repository, or with
`--to DIR` into DIR/REPO_ID as that repository's files would be (no network; what the tests use).

What is pushed is the release's own files only (model.safetensors, config.json, the card README.md, and
certificate.json where there is one), after the same checks load_released makes of them that need no
recomputation: config.json read through the format's allowlist, the weights' SHA-256 against it. A release whose
config.json says it is not protected is refused (exit 4) unless --allow-unprotected: its card then says NOT
PROTECTED on the hub too. Pushing proves nothing about the release; `verify robust` is how anyone checks it."""

import argparse
import re
import shutil
import sys
from pathlib import Path

from ttp_lightning.config.allowlist import FormatError
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED, TTPUserError
from ttp_lightning.core.files import atomic_write, sha256_of
from ttp_lightning.release.format import (
    CARD,
    CONFIG,
    RELEASE_FORMAT,
    WEIGHTS,
    not_protected_line,
    read_release_config,
)

CERTIFICATE = "certificate.json"
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class NotProtected(TTPUserError):
    """A release that says it is not protected, pushed without --allow-unprotected."""


def hub_files(release: Path, allow_unprotected: bool = False) -> list[str]:
    """The files of `release` a hub repository gets, after the checks (TTPUserError naming what is wrong)."""
    config = read_release_config(release)
    if config["format"] != RELEASE_FORMAT:
        raise TTPUserError(f"{str(release)!r} is a {config['format']} release, whose card is not a hub README.md; "
                           f"rerun the run that made it to write {RELEASE_FORMAT}")
    files = [name for name in (WEIGHTS, CONFIG, CARD, CERTIFICATE) if (release / name).is_file()]
    missing = [name for name in (WEIGHTS, CONFIG, CARD) if name not in files]
    if missing:
        raise TTPUserError(f"{str(release)!r} holds no {missing[0]}; a release folder holds {WEIGHTS}, {CONFIG}, {CARD}")
    if sha256_of(release / WEIGHTS) != config["weights"]["sha256"]:
        raise TTPUserError(f"{str(release / WEIGHTS)!r} is not the file {CONFIG} names (SHA-256 differs)")
    unprotected = not_protected_line(release, config)
    if unprotected and not allow_unprotected:
        raise NotProtected(f"{unprotected}; push it only with --allow-unprotected (its card says NOT PROTECTED)")
    return files


def push(release: str | Path, repo_id: str, to: str | Path | None = None, allow_unprotected: bool = False) -> str:
    """Push `release` to the hub repository `repo_id` (or, with `to`, into to/repo_id); returns where it went."""
    release = Path(release).expanduser()
    if not REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        raise TTPUserError(f"repo id {repo_id!r} is not allowed; give OWNER/NAME (letters, digits, '.', '_', '-')")
    files = hub_files(release, allow_unprotected)
    if to is not None:
        target = Path(to).expanduser() / repo_id
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            atomic_write(target / name, lambda tmp, name=name: shutil.copyfile(release / name, tmp))
        return str(target)
    from huggingface_hub import HfApi  # the network: never reached by the tests

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(release), allow_patterns=files,
                      commit_message="ttp_lightning release")
    return f"https://huggingface.co/{repo_id}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.push", description=__doc__.splitlines()[0])
    parser.add_argument("release", help="the release folder (release/ of a run)")
    parser.add_argument("repo_id", help="the hub repository, OWNER/NAME")
    parser.add_argument("--to", help="write the repository's files into TO/OWNER/NAME instead of pushing")
    parser.add_argument("--allow-unprotected", action="store_true",
                        help="push a release whose config.json says it is not protected")
    args = parser.parse_args(argv)
    try:
        where = push(args.release, args.repo_id, args.to, args.allow_unprotected)
    except NotProtected as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NOT_PROTECTED
    except (TTPUserError, FormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"pushed {args.release} -> {where}")
    return 0
