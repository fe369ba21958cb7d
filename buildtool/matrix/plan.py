"""Naming and tagging rules, in one place: what each cell builds and is called.

- dev image:     <registry>/<name>-dev:<git-sha>-<cell version>   (one per commit and cell)
- release image: <release registry>/<name>:<tag> for each of the cell's release tags
  (the formats and their parsers live in buildtool.contracts.names)
- base image:    the upstream base, or its mirror when BASE_MIRROR is set
- content key:   a hash of what decides the image's bytes, stored as a label, so an
                 unchanged cell is retagged instead of rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.common.errors import UserError
from buildtool.common.git_clone import refusal
from buildtool.common.refs import ReferenceError, parse_reference, shown, split_reference
from buildtool.contracts import names
from buildtool.contracts.names import DEFAULT_REGISTRY

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell, Run


@dataclass(frozen=True)
class Settings:
    """Where images go and where bases come from; read from the environment (make passes them)."""

    registry: str = DEFAULT_REGISTRY
    release_registry: str = DEFAULT_REGISTRY
    base_mirror: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        registry = env.get("REGISTRY") or DEFAULT_REGISTRY
        settings = cls(
            registry=registry.rstrip("/"),
            release_registry=(env.get("RELEASE_REGISTRY") or registry).rstrip("/"),
            base_mirror=env.get("BASE_MIRROR", "").strip(),
        )
        check_registry("REGISTRY", settings.registry)
        check_registry("RELEASE_REGISTRY", settings.release_registry)
        base_mirrors(settings.base_mirror)
        return settings


def check_registry(setting: str, value: str) -> str:
    """A registry host[:port] with an optional path (`127.0.0.1:5000`, `ghcr.io/team`)."""
    try:
        ok = bool(value) and bool(parse_reference(f"{value}/x").domain) and "@" not in value and ":" not in \
            value.partition("/")[2]
    except ReferenceError:
        ok = False
    if not ok:
        raise UserError(f"{setting}={shown(value)} is not a registry host[:port] with an optional path, e.g. "
                        f"{DEFAULT_REGISTRY} or ghcr.io/team")
    return value


def base_mirrors(base_mirror: str) -> str | dict[str, str]:
    """BASE_MIRROR as every reader takes it (settings and mirror_base read it here, so they cannot differ): ''
    (none), one registry, or {upstream host: mirror}. Anything else is refused: a list of plain registries
    would have become a reference no engine pulls, a host named twice a mirror chosen by position."""
    items = [item.strip() for item in base_mirror.split(",") if item.strip()]
    if not any("=" in item for item in items):
        if len(items) > 1:
            raise UserError(f"BASE_MIRROR={shown(base_mirror)} names {len(items)} registries: set one registry, or "
                            "`upstream-host=mirror` pairs separated by commas")
        # A trailing '/' is taken as REGISTRY's is: the registry without it.
        return check_registry("BASE_MIRROR", items[0].rstrip("/")) if items else ""
    pairs: dict[str, str] = {}
    for item in items:
        upstream, sep, mirror = item.partition("=")
        if not sep or not upstream or not mirror:
            raise UserError(f"BASE_MIRROR item {shown(item)} is not `upstream-host=mirror`")
        if upstream in pairs:
            raise UserError(f"BASE_MIRROR names {upstream} twice: keep one `{upstream}=mirror` pair")
        check_registry("BASE_MIRROR upstream", upstream)
        pairs[upstream] = check_registry("BASE_MIRROR", mirror.rstrip("/"))
    return pairs


def mirror_base(base: str, base_mirror: str) -> str:
    """Map an upstream base to its mirror.

    BASE_MIRROR is either one registry (optionally with a path prefix) that mirrors every
    upstream, `127.0.0.1:5000` -> `127.0.0.1:5000/nvidia/pytorch:25.10-py3`, or a comma list
    of `upstream-host=mirror` pairs for sites with one pull-through cache per upstream.
    """
    mirrors = base_mirrors(base_mirror)
    if not mirrors:
        return base
    host, path, tag = split_reference(base)
    target = mirrors.get(host) if isinstance(mirrors, dict) else mirrors
    if target is None:
        return base
    sep = "" if tag.startswith("@") else ":"
    return f"{target.rstrip('/')}/{path}{sep}{tag}"


# What `release` writes (release manifests and notes, the catalogue that lists them) changes no
# image, so it never makes the tree dirty: re-running a release finds the same dev tags.
REVISION_PATHSPEC = (".", ":(exclude)docs/releases", ":(exclude)docs/images.md")


def _git_bytes(repo: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=30).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        refused = refusal(repo, exc.stderr or b"") if isinstance(exc, subprocess.CalledProcessError) else ""
        raise UserError(refused or f"cannot read the git revision of {repo} ({exc}); run inside a git clone "
                        "with at least one commit") from None


def _dirty_suffix(repo: Path) -> str:
    """`-dirty.<hash of the changes>` for a work tree with changes (outside REVISION_PATHSPEC), else ''."""
    # -z: NUL-separated, names unquoted (a name with a space or non-ASCII is read as it is); all: every untracked
    # file, not only its new folder, so each one's contents are hashed. Bytes: a name need not be UTF-8.
    status = _git_bytes(repo, "status", "--porcelain", "-z", "--untracked-files=all", "--", *REVISION_PATHSPEC)
    if not status.strip(b"\0"):
        return ""
    digest = hashlib.sha256(_git_bytes(repo, "diff", "HEAD", "--", *REVISION_PATHSPEC) + status)
    for record in status.split(b"\0"):
        if record.startswith(b"?? "):
            digest.update(_untracked_bytes(repo / os.fsdecode(record[3:])))
    return f"-dirty.{digest.hexdigest()[:8]}"


def _untracked_bytes(path: Path) -> bytes:
    """What an untracked file adds to the dirty hash: its length and contents (a link: its target)."""
    try:
        data = os.fsencode(os.readlink(path)) if path.is_symlink() else path.read_bytes() if path.is_file() else b""
    except OSError as exc:
        raise UserError(f"cannot read the untracked file {path} for the dirty revision ({exc.strerror}); "
                        "remove it, add it to .gitignore or make it readable") from None
    return b"%d\0" % len(data) + data


def git_revision(repo: Path) -> str:
    """Short sha of HEAD; a dirty work tree gets `-dirty.<hash of the changes>`.

    The suffix differs for every distinct set of uncommitted changes, so a dirty build is
    never mistaken for the commit's image nor for another dirty build. Changes to the files
    a release writes (REVISION_PATHSPEC) do not count.
    """
    return _git_bytes(repo, "rev-parse", "--short=12", "HEAD").decode("utf-8", "replace").strip() + _dirty_suffix(repo)


def git_full_revision(repo: Path) -> str:
    """`git_revision` with the whole 40-hex sha: what the revision label of an image built here says."""
    return _git_bytes(repo, "rev-parse", "HEAD").decode("utf-8", "replace").strip() + _dirty_suffix(repo)


def full_revision(root: Path, revision: str) -> str:
    """The revision label for images tagged with `revision`: a git revision (`<sha>[-dirty.<hash>]`) is
    its commit in full with the same dirty hash; a name a pipeline gave (`nightly-42`) labels the work
    tree's own commit. UserError when the sha is no commit of this clone (the label would be a guess)."""
    match = names.GIT_REVISION_RE.match(revision)
    if match is None:
        full = git_full_revision(root)
    else:
        sha = _git_commit(root, match.group("sha"), digits=40)
        if sha is None:
            raise UserError(f"revision {revision!r} is not a commit of {root}: the image's revision label must "
                            "name the whole commit (build in the clone that has it)")
        dirty = match.group("dirty")
        full = sha + (f"-dirty.{dirty}" if dirty else "")
    try:
        return names.check_full_revision(full)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def run_profile(run: Run) -> dict[str, object]:
    """A cell's run profile as the plan's JSON and the image's run-profile label state it."""
    return {"shm_size": run.shm_size, "ipc": run.ipc, "ulimits": dict(run.ulimits), "gpus": run.gpus,
            "docker_flags": run.docker_flags()}


@dataclass(frozen=True)
class CellPlan:
    """What one cell will produce; the JSON form is what CI matrices consume."""

    cell: Cell
    revision: str
    dev_repo: str
    dev_tag: str
    release_repo: str
    release_tags: tuple[str, ...]
    moving_tags: tuple[str, ...]
    base: str
    build_args: dict[str, str] = field(default_factory=dict)

    @property
    def dev_ref(self) -> str:
        return f"{self.dev_repo}:{self.dev_tag}"

    def to_json(self) -> dict[str, object]:
        c = self.cell
        return {
            "cell": c.key,
            "image": c.name,
            "version": c.version,
            "default": c.default,
            "framework": c.framework,
            "framework_version": c.framework_version,
            "accelerator": c.accelerator,
            "python": c.python,
            "dockerfile": c.dockerfile,
            "dev_image": self.dev_ref,
            "dev_repo": self.dev_repo,
            "dev_tag": self.dev_tag,
            "release_repo": self.release_repo,
            "release_tags": list(self.release_tags),
            "moving_tags": list(self.moving_tags),
            "upstream_base": c.base,
            "base": self.base,
            "build_args": dict(self.build_args),
            "tests": list(c.tests),
            "needs_gpu": c.needs_gpu,
            "run": run_profile(c.run),
            "use": c.use,
        }


def plan_cell(cell: Cell, settings: Settings, revision: str, release: str = "{release}") -> CellPlan:
    base = mirror_base(cell.base, settings.base_mirror)
    return CellPlan(
        cell=cell,
        revision=revision,
        dev_repo=names.dev_repo(settings.registry, cell.name),
        dev_tag=names.dev_tag(revision, cell.version),
        release_repo=names.release_repo(settings.release_registry, cell.name),
        release_tags=tuple(names.expand_tag(t, cell.version, release) for t in cell.release_tags),
        moving_tags=tuple(names.expand_tag(t, cell.version, release) for t in cell.moving_tags),
        base=base,
        build_args={"BASE_IMAGE": base},
    )


def plan_matrix(cells: list[Cell], settings: Settings, revision: str, release: str = "{release}") -> list[CellPlan]:
    return [plan_cell(cell, settings, revision, release) for cell in cells]


def content_key(dockerfile: bytes, base_digest: str, settings: dict[str, str],
                copied_files: dict[str, bytes] | None = None) -> str:
    """Hash of what decides an image's content: its Dockerfile, the files it copies, the
    base's digest and the build settings that change the result (never secrets)."""
    digest = hashlib.sha256()
    digest.update(b"dockerfile\0" + dockerfile + b"\0")
    for name, data in sorted((copied_files or {}).items()):
        digest.update(f"file\0{name}\0".encode() + hashlib.sha256(data).digest())
    digest.update(f"base\0{base_digest}\0".encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return f"sha256:{digest.hexdigest()}"


def resolve_revision(root: Path, override: str | None, current: Callable[[Path], str],
                     option: str = "--revision") -> str:
    """The revision whose dev tags a command uses: `override` or the work tree's (`current`).

    A git sha (any abbreviation, any case, with or without `-dirty.<hash>`) or a git ref of this
    clone (a branch, a tag) becomes the 12-digit sha builds tag with; any other tag-safe word is a
    revision a pipeline named itself (`build --revision nightly-42`) and is kept as it is."""
    if not override:
        return current(root)
    text = override.strip()
    match = names.GIT_REVISION_RE.match(text.lower())
    if match is not None:
        sha, dirty = match.group("sha"), match.group("dirty")
        short = _git_commit(root, sha)
        if short is None:
            if len(sha) < 12:
                raise UserError(f"{option} {override!r} is not a commit of this clone; pass at least 12 hex digits")
            short = sha[:12]
        return f"{short}-dirty.{dirty}" if dirty else short
    short = _git_commit(root, text)
    if short is not None:
        return short
    try:
        return names.check_revision(text)
    except ValueError as exc:
        raise UserError(f"{option} {override!r} is neither a commit of this clone nor a revision name: {exc}") \
            from None


def _git_commit(root: Path, name: str, digits: int = 12) -> str | None:
    """The sha (12 digits, or 40: all of it) of the commit `name` names in this clone (sha prefix, branch, tag),
    or None."""
    if name.startswith("-"):
        return None
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"--short={digits}",
                               f"{name}^{{commit}}"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    refused = refusal(root, proc.stderr)
    if refused:   # no answer about `name` at all: never "not a commit" (a branch would be taken as a revision name)
        raise UserError(refused)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None
