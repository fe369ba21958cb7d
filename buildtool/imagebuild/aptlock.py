"""Locked system packages: resolve, write and check each pip cell's `apt.lock` (format: contracts.aptlock;
docs/contents.md#locks).

Only pip cells (templates/parts/python.j2) run an apt step; NGC cells add no Debian package to their base, so
they have no apt lock (one beside them is an error, as are apt_packages on them). `make lock` runs `apt-get
install -s --no-install-recommends` inside the cell's own base (host network, one throw-away container): its
`Inst` lines, upgrades of base packages included, are the lock, and `dpkg-query -W` there is `base.dpkg`. The
drift check runs it again plain and with every locked version pinned (apt preferences, priority 1001: the closure
of these versions whatever Debian released since) and compares entry by entry (`compare`). A multi-platform cell
has the files per platform folder, each resolved in that platform's image of the base (under QEMU where
emulated): Debian's package closure and versions can differ per architecture.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import Reference, ReferenceError, parse_reference, split_repo
from buildtool.contracts import label_keys, platforms
from buildtool.contracts.apt_lock_format import (
    APT_LOCK,
    BASE_DPKG,
    DEB_HASHES,
    NOT_SERVED,
    AptLock,
    entries_digest,
    format_apt_lock,
    parse_apt_lock,
    parse_deb_hashes,
    parse_entries,
    parse_package_records,
    parse_simulation,
)
from buildtool.contracts.locks import platform_folder
from buildtool.matrix.schema import Cell

# What python.j2 always installs; the matrix's apt_packages come after.
ALWAYS = ("ca-certificates", "python3", "python3-venv")
ARCH = platforms.get(platforms.DEFAULT[0]).architecture   # Debian's architecture of the default platform
PROBE_TIMEOUT = 300

Log = Callable[[str], None]


def has_apt_step(cell: Cell) -> bool:
    """Cells rendered with python.j2 (pip cells): NGC cells bring their Python and add no Debian package."""
    return bool(cell.framework_requirements)


def named_packages(cell: Cell) -> list[str]:
    return [*ALWAYS, *(p for p in cell.apt_packages if p.split("=", 1)[0] not in ALWAYS)]


def architecture(cell: Cell, platform: str | None) -> str:
    """Debian's architecture of `cell`'s `platform` (None: its only one; refused on a multi-platform cell)."""
    return platform_folder(Path(cell.dockerfile).parent, cell.key, cell.platforms, platform)[0].architecture


def fingerprint(cell: Cell, platform: str | None = None) -> str:
    """The matrix values an apt lock follows from; a change makes it stale. Not the base's digest: the base
    follows the archive (a new base, made from a newer archive state, is the drift check's to report: its
    packages against base.dpkg); `resolved-in` names the base by digest."""
    data = {"packages": named_packages(cell), "base": cell.base, "arch": architecture(cell, platform)}
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def paths(root: Path, cell: Cell, platform: str | None = None) -> tuple[Path, Path]:
    """(apt.lock, base.dpkg) of the cell's `platform` (None: its only one; refused on a multi-platform cell)."""
    folder = platform_folder((root / cell.dockerfile).parent, cell.key, cell.platforms, platform)[1]
    return folder / APT_LOCK, folder / BASE_DPKG


def read(root: Path, cell: Cell, platform: str | None = None) -> AptLock:
    """The committed apt lock of a pip cell's `platform`; UserError naming the file and `make lock` when
    missing, broken or resolved for another architecture."""
    path = paths(root, cell, platform)[0]
    rel = path.relative_to(root)
    if not path.is_file():
        raise UserError(f"{rel} is missing; run `make lock FRAMEWORK={cell.key}`")
    try:
        lock = parse_apt_lock(path.read_text())
    except ValueError as exc:
        raise UserError(f"{rel}: {exc}; run `make lock FRAMEWORK={cell.key}`") from None
    arch = architecture(cell, platform)
    if lock.header["arch"] != arch:
        raise UserError(f"{rel} was resolved for {lock.header['arch']}, not {arch}; "
                        f"run `make lock FRAMEWORK={cell.key}`")
    return lock


def check_cell(root: Path, cell: Cell) -> list[str]:
    """Offline problems of every platform's apt lock: missing/broken/stale lock, a named package not locked
    or at another version than the matrix pins, entries changed since `make lock` wrote them, base.dpkg not
    the one the lock names."""
    return [problem for platform in cell.platforms for problem in _check_platform(root, cell, platform)]


def _check_platform(root: Path, cell: Cell, platform: str) -> list[str]:
    lock_path, dpkg_path = paths(root, cell, platform)
    fix = f"run `make lock FRAMEWORK={cell.key}`"
    if not has_apt_step(cell):
        problems = []
        if cell.apt_packages and platform == cell.platforms[0]:
            problems.append(f"{cell.key}: apt_packages {', '.join(cell.apt_packages)} on an NGC cell, whose "
                            "template runs no apt step (they would never be installed); remove them from matrix.yaml")
        if lock_path.is_file():
            problems.append(f"{lock_path.relative_to(root)}: an NGC cell installs no Debian packages; delete it")
        return problems
    try:
        lock = read(root, cell, platform)
    except UserError as exc:
        return [str(exc)]
    rel = lock_path.relative_to(root)
    problems = []
    if lock.inputs != fingerprint(cell, platform):
        problems.append(f"{rel} is stale (the matrix's apt packages or base changed); {fix}")
    for item in named_packages(cell):
        name, _, version = item.partition("=")
        have = lock.entries.get(name)
        if have is None:
            problems.append(f"{rel}: {name} is named in matrix.yaml but not locked; {fix}")
        elif version and have != version:
            problems.append(f"{rel}: matrix.yaml pins {name}={version} but the lock has {have}; {fix}")
    if not lock.digest_matches():
        problems.append(f"{rel}: its entries are not the ones `make lock` wrote (edited by hand: a line deleted, "
                        f"added or re-versioned); {fix}")
    try:
        base = parse_entries(dpkg_path.read_text(), BASE_DPKG)
    except (OSError, ValueError) as exc:
        problems.append(f"{dpkg_path.relative_to(root)}: {exc}; {fix}")
    else:
        if lock.header["base-packages"].split(" ", 1)[0] != entries_digest(base):
            problems.append(f"{dpkg_path.relative_to(root)} is not the base list {rel} was resolved with; {fix}")
        problems += _hash_problems(root, cell, {**base, **lock.entries}, fix, platform)
    return problems


def _hash_problems(root: Path, cell: Cell, entries: dict[str, str], fix: str, platform: str) -> list[str]:
    """DEB_HASHES must list exactly the packages of base.dpkg and apt.lock, at their versions."""
    path = hashes_path(root, cell, platform)
    rel = path.relative_to(root)
    try:
        hashes = parse_deb_hashes(path.read_text(), str(rel))
    except OSError:
        return [f"{rel} is missing (the SBOM's hashes of the Debian packages); {fix}"]
    except ValueError as exc:
        return [f"{exc}; {fix}"]
    wanted = {f"{n}={v}" for n, v in entries.items()}
    missing, extra = sorted(wanted - set(hashes)), sorted(set(hashes) - wanted)
    if missing or extra:
        said = ", ".join([*(f"{k} missing" for k in missing[:3]), *(f"{k} not locked" for k in extra[:3])])
        return [f"{rel} does not list exactly the packages of {BASE_DPKG} and {APT_LOCK} ({said}); {fix}"]
    return []


# -- asking the base ----------------------------------------------------------------------------

# Run inside the base. $1: a preferences file to pin with ('' for none); the rest: what to install.
PROBE = r"""set -eu
export DEBIAN_FRONTEND=noninteractive
prefs=$1; shift
echo "--- arch"; dpkg --print-architecture
echo "--- base"; dpkg-query -W -f '${Package}=${Version}\n'
if ! apt-get update -qq >/tmp/update.log 2>&1; then tail -3 /tmp/update.log >&2; exit 3; fi
echo "--- plan"; apt-get install -s --no-install-recommends "$@" 2>&1
echo "--- pinned"
if [ -n "$prefs" ]; then
  printf '%s' "$prefs" > /etc/apt/preferences.d/buildtool-lock
  apt-get install -s --no-install-recommends "$@" 2>&1
fi
echo "--- served"; apt-cache madison "$@" $(printf '%s' "$prefs" | sed -n 's/^Package: //p') 2>/dev/null || true
echo "--- hashes"
{ dpkg-query -W -f '${Package}=${Version}\n'
  apt-get install -s --no-install-recommends "$@" 2>/dev/null \
    | sed -n 's/^Inst \([^ :]*\)\(:[^ ]*\)\{0,1\} \(\[[^]]*\] \)\{0,1\}(\([^ ]*\) .*/\1=\4/p'
} | sort -u | xargs apt-cache show 2>/dev/null || true
"""


@dataclass(frozen=True)
class Probe:
    arch: str
    base: dict[str, str]
    plan: dict[str, str]                  # what `make lock` resolves today (no pins)
    served: set[tuple[str, str]]          # (package, version) the archive serves
    pinned: dict[str, str] = field(default_factory=dict)   # the closure with every locked version pinned
    hashes: dict[str, str] = field(default_factory=dict)   # "name=version" -> the .deb's sha256 (archive's index)


def parse_probe(output: str) -> Probe:
    """The probe's sections; ValueError when one is missing or apt refused the install."""
    # A `--- name` line opens a section: the lines up to the next one.
    parts = re.split(r"^--- (.*)\n?", "\n".join(output.splitlines()), flags=re.MULTILINE)
    sections = {name.strip(): body for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    missing = [s for s in ("arch", "base", "plan", "pinned", "served", "hashes") if s not in sections]
    if missing:
        raise ValueError(f"the probe printed no {', '.join(missing)} section")
    errors = [ln for s in ("plan", "pinned") for ln in sections[s].splitlines() if ln.startswith("E: ")]
    if errors:
        raise ValueError(f"apt-get install -s refused: {errors[0][3:][:200]}")
    rows = [[part.strip() for part in line.split("|")] for line in sections["served"].splitlines()]
    served = {(row[0], row[1]) for row in rows if len(row) >= 3}   # apt-cache madison's
    arch = "".join(sections["arch"].splitlines()).strip()
    return Probe(arch=arch, base=parse_entries(sections["base"], "dpkg-query"),
                 plan=parse_simulation(sections["plan"], arch), served=served,
                 pinned=parse_simulation(sections["pinned"], arch), hashes=parse_package_records(sections["hashes"]))


def run_probe(base_ref: str, install: list[str], prefs: str = "", platform: str | None = None) -> Probe:
    """Run PROBE in a throw-away container of the base (host network: apt-get update); always removed.
    `platform` (os/arch): run the base's image of that platform (under QEMU where it is not this machine's);
    None: the default platform, as the base is."""
    import docker.errors
    import requests

    from buildtool.imagebuild import engine
    from buildtool.imagebuild.engine import sdk_reason, sdk_timed_out

    arch = platforms.get(platform).architecture if platform else ARCH
    placed = {"platform": platform} if platform else {}
    sdk_errors = (docker.errors.DockerException, requests.RequestException)
    try:
        if engine.image_attrs(base_ref) is None:
            engine.pull(base_ref, **placed)
        container = engine.sdk().containers.create(base_ref, ["sh", "-c", PROBE, "probe", prefs, *install],
                                                   network_mode="host", user="0", **placed)
    except (RuntimeError, *sdk_errors) as exc:
        raise FailedError(f"cannot ask the base {base_ref} for its apt packages: {sdk_reason(exc)}; where the base "
                          "cannot be pulled, set BASE_MIRROR (BASE_MIRROR=127.0.0.1:5000: make lock fills it)") \
            from None
    try:
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()
    except sdk_errors as exc:
        raise FailedError(f"the apt probe in {base_ref} " + (
            f"did not finish within {PROBE_TIMEOUT}s (apt-get update under QEMU or a slow archive)"
            if sdk_timed_out(exc)
            else "failed in the engine") + f": {sdk_reason(exc)}") from None
    finally:
        try:
            container.remove(force=True)
        except sdk_errors as exc:
            raise FailedError(f"cannot remove the apt probe's container {container.short_id} of {base_ref} "
                              f"({sdk_reason(exc)}): remove it with `docker rm -f {container.short_id}`") from None
    if status.get("StatusCode") == 3:
        raise FailedError(f"apt-get update failed in {base_ref} (the Debian archive must be reachable): "
                          f"{' | '.join(err.splitlines()[-2:])[:200]}")
    if status.get("StatusCode") != 0:
        raise FailedError(f"the apt probe in {base_ref} exited {status.get('StatusCode')}: {err[:200]}")
    try:
        probe = parse_probe(out)
    except ValueError as exc:
        raise FailedError(f"{base_ref}: {exc}") from None
    if probe.arch != arch:
        raise FailedError(f"{base_ref} is {probe.arch!r}, the apt locks are for {arch}")
    return probe


def platform_base(base_ref: str, platform: str) -> str:
    """The image of `platform` in the base `base_ref` (a registry reference, such as the mirror's): the child
    of an image index by digest, or the image itself when it is that platform's. FailedError naming the base
    and the platform when the registry has none (a base mirrored for amd64 only)."""
    from buildtool.registry.client import DOCKER_LIST, OCI_INDEX, RegistryClient, RegistryUnreachable
    from buildtool.registry.image_index import MAX_CONFIG_BYTES

    wanted = platforms.get(platform)
    host, repo, ref = split_repo(base_ref)
    client = RegistryClient(host)
    try:
        body, media_type, digest = client.get_manifest(repo, ref)
    except RegistryUnreachable:   # its words name REGISTRY, which is not where a base is read from
        raise UserError(f"cannot read the base {base_ref}: registry {host} is unreachable; set BASE_MIRROR to a "
                        "registry that holds the bases (`make bases BASE_MIRROR=127.0.0.1:5000` fills the local one), "
                        f"or start {host}") from None
    document = json.loads(body)
    if media_type in (OCI_INDEX, DOCKER_LIST) or "manifests" in document:
        for entry in document.get("manifests", []):
            try:
                found = platforms.from_descriptor(entry.get("platform"))
            except platforms.UnknownPlatform:
                continue  # attestations and platforms this toolkit does not build
            if found == wanted:
                return f"{host}/{repo}@{entry['digest']}"
        listed = ", ".join(f"{(e.get('platform') or {}).get('os')}/{(e.get('platform') or {}).get('architecture')}"
                           for e in document.get("manifests", []))
        raise FailedError(f"the base {base_ref} has no {platform} image (its index lists {listed or 'nothing'}); "
                          f"mirror the base for {platform} (`make bases`)")
    described = document.get("config") if isinstance(document, dict) else None
    if not isinstance(described, dict) or not isinstance(described.get("digest"), str):
        # An artifact or another kind of manifest under the tag: no image config to read the platform from.
        raise FailedError(f"the base {base_ref} is no image: its manifest ({media_type or 'no media type'}) has no "
                          f"config digest (an artifact?); mirror the base for {platform} (`make bases`)")
    config = json.loads(client.get_blob(repo, described["digest"], limit=MAX_CONFIG_BYTES))
    have = f"{config.get('os')}/{config.get('architecture')}"
    if have != platform:
        raise FailedError(f"the base {base_ref} is one {have} image, not an index with {platform}; mirror the base "
                          f"for {platform} (`make bases`)")
    return f"{host}/{repo}@{digest}"


def base_source(base_ref: str) -> str:
    """How the base was made, from its label (mmdebstrap) or its being a plain pull."""
    from buildtool.imagebuild import engine

    attrs = engine.image_attrs(base_ref) or {}
    made = ((attrs.get("Config") or {}).get("Labels") or {}).get(label_keys.BASE_SOURCE)
    named = f" ({made})" if made else ""
    if "@" in base_ref:  # a platform's image of an index, by its digest (platform_base)
        return base_ref + named
    # The digest of the base's own repository (the engine lists Docker Hub's by their short names, a registry's
    # `:port` is no tag); another registry's digest, or none, would record a base the lock was not resolved in.
    wanted = parse_reference(base_ref)
    digest = next((d.partition("@")[2] for d in attrs.get("RepoDigests") or [] if "@" in d and
                   _same_repository(d.partition("@")[0], wanted)), None)
    if digest is None:
        raise FailedError(f"the base {base_ref} in the engine has no digest of its repository {wanted.name} (built "
                          "here, never pulled from it or pushed to it): push it there, or remove the local image so "
                          "`make lock` pulls it")
    return f"{base_ref}@{digest}{named}"


def _same_repository(name: str, wanted: Reference) -> bool:
    try:
        found = parse_reference(name)
    except ReferenceError:
        return False
    return (found.registry, found.repository) == (wanted.registry, wanted.repository)


# -- writing --------------------------------------------------------------------------------------

def hashes_path(root: Path, cell: Cell, platform: str | None = None) -> Path:
    return platform_folder((root / cell.dockerfile).parent, cell.key, cell.platforms, platform)[1] / DEB_HASHES


def deb_hashes_text(entries: dict[str, str], hashes: dict[str, str]) -> str:
    """DEB_HASHES for `entries` (name -> version): each .deb's sha256, NOT_SERVED where the archive had none."""
    lines = [f"{n}={v} {hashes.get(f'{n}={v}', NOT_SERVED)}\n" for n, v in sorted(entries.items())]
    return (f"# GENERATED FILE - DO NOT EDIT (`make lock`). The sha256 of the .deb of each package of {BASE_DPKG} "
            f"and {APT_LOCK},\n# as the Debian archive's index listed it ({NOT_SERVED}: that version was no longer "
            "served); the SBOM's hashes.\n" + "".join(lines))


def read_hashes(root: Path, cell: Cell, platform: str | None = None) -> dict[str, str]:
    """The DEB_HASHES of the cell's `platform` ("name=version" -> sha256 or NOT_SERVED; None: its only
    platform, refused on a multi-platform cell); {} for a cell without an apt step. UserError naming the file
    when it is missing or broken."""
    path = hashes_path(root, cell, platform)
    if not has_apt_step(cell):
        return {}
    try:
        return parse_deb_hashes(path.read_text(), str(path.relative_to(root)))
    except OSError:
        raise UserError(f"{path.relative_to(root)} is missing; run `make lock FRAMEWORK={cell.key}`") from None
    except ValueError as exc:
        raise UserError(f"{exc}; run `make lock FRAMEWORK={cell.key}`") from None


def lock_text(cell: Cell, probe: Probe, resolved_in: str, platform: str | None = None) -> tuple[str, str, str]:
    """(apt.lock, base.dpkg, debs.sha256) texts for a probe of the cell's base."""
    preamble = [
        f"GENERATED FILE - DO NOT EDIT. Refresh with `make lock FRAMEWORK={cell.key}`.",
        f"Lock of cell {cell.key}, system layer: every Debian package its apt step installs on top of its base",
        f"(apt-get install -s --no-install-recommends {' '.join(named_packages(cell))}, run inside the base).",
    ]
    base_body = "".join(f"{n}={v}\n" for n, v in sorted(probe.base.items()))
    header = {"inputs": fingerprint(cell, platform), "base": cell.base, "resolved-in": resolved_in,
              "base-packages": f"{entries_digest(probe.base)} ({len(probe.base)} in {BASE_DPKG})",
              "arch": architecture(cell, platform)}
    dpkg = (f"# GENERATED FILE - DO NOT EDIT. The packages of the base {APT_LOCK} was resolved in: "
            f"dpkg-query -W inside\n# {resolved_in}\n" + base_body)
    return (format_apt_lock(header, probe.plan, preamble), dpkg,
            deb_hashes_text({**probe.base, **probe.plan}, probe.hashes))


def lock_texts(root: Path, cell: Cell, base_ref: str, log: Log) -> dict[Path, str]:
    """A pip cell's apt lock resolved in its base, on each of its platforms: apt.lock, base.dpkg and debs.sha256,
    path -> text, nothing written. On a multi-platform cell `base_ref` must be a registry reference whose index has
    each platform's image (platform_base). Each is run by the digest the registry holds: the engine may keep an
    older image under the base's tag (a mirror made again), a base nothing builds on."""
    texts: dict[Path, str] = {}
    for platform in cell.platforms if cell.multi_platform else (None,):
        ref = platform_base(base_ref, platform or cell.platforms[0])
        log(f"[{cell.key}] resolving its Debian packages in {ref}" + (f" ({platform})" if platform else ""))
        resolved = lock_text(cell, run_probe(ref, named_packages(cell), platform=platform), base_source(ref), platform)
        # The base is reproducible (issue 52): `resolved-in` names by digest the base the image is built on, so a
        # lock resolved in another base is written again even where its packages did not move.
        texts.update(zip((*paths(root, cell, platform), hashes_path(root, cell, platform)), resolved, strict=True))
    return texts


# -- drift ------------------------------------------------------------------------------------------

def preferences(entries: dict[str, str]) -> str:
    """An apt preferences file pinning every locked version (1001: even below an installed version)."""
    return "".join(f"Package: {n}\nPin: version {v}\nPin-Priority: 1001\n\n" for n, v in sorted(entries.items()))


def compare(rel: str, lock: AptLock, probe: Probe, base_rel: str, base: dict[str, str]) -> list[str]:
    """Entry-by-entry differences between a lock and its re-resolution, and of the base list. Which packages:
    the closure with every locked version pinned (so a deleted or added line shows whatever Debian released
    since); which versions: a locked version Debian no longer serves, or one other than `make lock` resolves
    (a hand edit; or a lock older than a Debian update that still serves the old version too)."""
    found = []
    for name in sorted(set(lock.entries) | set(probe.pinned)):
        have, want = lock.entries.get(name), probe.pinned.get(name)
        today = probe.plan.get(name, want)
        if have is None:
            found.append(f"{rel}: {name} deleted by hand (the resolution installs {name} {want})")
        elif want is None:
            found.append(f"{rel}: {name} added by hand ({have} is listed but nothing installs it)")
        elif (name, have) not in probe.served:
            found.append(f"{rel}: {name} {have} is no longer served by Debian (it serves {today})")
        elif have != today:
            found.append(f"{rel}: {name} re-versioned by hand (lock {have}, `make lock` resolves {today})")
    moved = sorted(n for n in set(base) | set(probe.base) if base.get(n) != probe.base.get(n))
    if moved:
        shown = ", ".join(f"{n} {base.get(n, '-')} -> {probe.base.get(n, '-')}" for n in moved[:3])
        found.append(f"{base_rel}: the base is not the one the lock was resolved in ({len(moved)} package(s) differ: "
                     f"{shown}{' ...' if len(moved) > 3 else ''})")
    return found


def cell_drift(root: Path, cell: Cell, base_ref: str, log: Log) -> list[str]:
    """Problems of a pip cell's committed apt locks, each platform's, against their pinned re-resolution in
    `base_ref` (on a multi-platform cell: in its image of each platform, platform_base)."""
    found = []
    for platform in cell.platforms if cell.multi_platform else (None,):
        lock = read(root, cell, platform)
        lock_path, dpkg_path = paths(root, cell, platform)
        try:
            ref = platform_base(base_ref, platform or cell.platforms[0])   # by digest, as lock_texts
            log(f"[{cell.key}] re-resolving {lock_path.relative_to(root)} in {ref}")
            probe = run_probe(ref, named_packages(cell), preferences(lock.entries), platform=platform)
        except FailedError as exc:
            raise FailedError(f"{cell.key}: cannot re-resolve its apt lock to check it ({exc}); the check needs "
                              "the engine, the base (`make bases`) and the Debian archive; `buildtool check "
                              "--offline` checks only the matrix and the lock's own digest") from None
        base = parse_entries(dpkg_path.read_text(), BASE_DPKG)
        found += [f"{p}; run `make lock FRAMEWORK={cell.key}`" for p in compare(
            str(lock_path.relative_to(root)), lock, probe, str(dpkg_path.relative_to(root)), base)]
    return found
