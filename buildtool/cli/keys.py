"""`buildtool keys`: make the key pair a validating runner signs verdicts with (role tester), or a
build job signs provenance and SBOMs with (role builder).

The private key signs (it belongs to the jobs of that role, as a CI secret); the public key goes into
config/trusted-keys.yaml with its roles by a reviewed commit, which is what makes release accept what
it signs in those roles. `--dev` makes (or shows) this machine's local development key instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import printable, writing
from buildtool.cli.options import log, path_of, say
from buildtool.common.errors import UserError
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.attest.dsse import PublicKey

DEFAULT_NAME = "validate-runners"
NameOption = Annotated[str, typer.Option(help="Who holds the key, e.g. gpu-runners-2026 (file names, trust entry).")]
OutDirOption = Annotated[Path | None, typer.Option(
    "--out", parser=path_of("--out"),
    help="Folder for NAME.key (private, 0600) and NAME.pub (default ~/.config/dl-images/keys).")]
RoleOption = Annotated[list[str] | None, typer.Option(
    "--role", help="What the key signs: tester (verdicts, the default) or builder (provenance, SBOMs); "
    "repeat for both.")]
DevOption = Annotated[bool, typer.Option(
    "--dev", help="Make (or show) this machine's local dev key, which validate uses when "
    "DL_IMAGES_SIGNING_KEY is unset.")]


def keys(
    name: NameOption = DEFAULT_NAME,
    out_dir: OutDirOption = None,
    role: RoleOption = None,
    dev: DevOption = False,
) -> None:
    """Create an Ed25519 key pair for signing verdicts or builds and say where each half must live."""
    check_arguments("keys", locals())   # every argument first (issue 37)
    from buildtool.attest.dsse import generate, write_private
    from buildtool.attest.keys import TESTER, is_dev_name
    from buildtool.attest.verdict_statement import config_home

    roles = tuple(dict.fromkeys(role or [TESTER]))   # tester, builder or both (check_arguments)
    if dev:
        # The dev key has one place and signs in both roles: --out, --name and --role were ignored, and the key
        # the user asked for somewhere else was never made there.
        given = [flag for flag, value in (("--out", out_dir), ("--name", name), ("--role", role))
                 if value is not None and value != DEFAULT_NAME]
        if given:
            raise UserError(f"--dev makes this machine's local dev key in its own place, in both roles: "
                            f"{', '.join(given)} cannot go with it; drop --dev to make a key pair for a role")
        _show_dev_key()
        return
    if not re.fullmatch(r"[a-z0-9._-]+", name):
        raise UserError(f"--name {name!r}: use lower-case letters, digits, '-', '_' and '.'")
    if is_dev_name(name):   # config/trusted-keys.yaml would refuse the entry printed for it
        raise UserError(f"--name {name!r}: the name says it is a dev key, which config/trusted-keys.yaml never "
                        "lists; name the key after its runners (e.g. gpu-runners)")
    folder = (out_dir or config_home() / "dl-images" / "keys").expanduser().resolve()
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    for path in (private, public):
        if path.exists():
            raise UserError(f"{path} exists; keys are never overwritten: choose another --name or --out")
    if any((parent / ".git").exists() for parent in (folder, *folder.parents)):   # inside a git work tree
        # Verbatim: rich made an emoji code in the folder's name (`:ok:`) an emoji, even with markup off.
        log(printable(f"warning: {folder} is inside a git work tree; never commit {private.name}"))
    key = generate()
    with writing("--out", folder):   # a folder that cannot be made or written is one line, not a traceback
        try:
            write_private(private, key)   # created exclusively: a key made meanwhile is refused, never replaced
            public.write_text(key.public().pem)
        except FileExistsError:   # that other key is not ours to remove
            raise
        except BaseException:   # Ctrl-C too: no half of the pair left (a rerun would be refused: "exists")
            for path in (private, public):
                path.unlink(missing_ok=True)
            raise
    say(f"key id:      {key.keyid}")
    _say_where(name, key.public(), roles, private, public)


def _show_dev_key() -> None:
    """`keys --dev`: make (or show) this machine's local dev key, and what it is good for."""
    import os

    from buildtool.attest.keys import signing_key
    from buildtool.attest.verdict_statement import SIGNING_KEY_ENV, dev_key_path

    os.environ.pop(SIGNING_KEY_ENV, None)   # the dev key, whatever this shell has set
    dev_key = signing_key(log)
    say(f"local dev key: {dev_key_path()} (key id {dev_key.key.keyid})")
    say("validate signs with it when DL_IMAGES_SIGNING_KEY is unset; release trusts it only with "
        "--trust-local-key, and only for a loopback registry (e.g. 127.0.0.1:5000)")


def _say_where(name: str, key: PublicKey, roles: tuple[str, ...], private: Path, public: Path) -> None:
    """Where each half of a new key pair must live: the private one a CI secret, the public one trusted."""
    from buildtool.attest.keys import KEY_ENV, trusted_entry
    from buildtool.attest.verdict_statement import TRUSTED_KEYS_FILE

    jobs = {"tester": "that run `make validate` (the nightly and GPU runners)",
            "builder": "that run `make push` (the build jobs)"}
    secrets = " and ".join(f"{KEY_ENV[r]} of the jobs {jobs[r]}" for r in roles)
    say(f"private key: {private} (owner-only). Store its content as the CI secret {secrets}, then delete this "
        "file. Never commit it, never give it to pull-request jobs.")
    say(f"public key:  {public}. Trust it by adding these lines under `keys:` in {TRUSTED_KEYS_FILE}, "
        "in a reviewed commit:")
    say(trusted_entry(name, key, roles).rstrip("\n"))
