"""`report --fetch`: each cell's verdicts from the registry, as release would read them.

A single-platform cell's dev tag is one image: its newest trusted verdict. A multi-platform cell's dev
tag is an image index: the newest trusted verdict of EACH platform manifest, found by that manifest's
digest (buildtool.validate.verdicts, as buildtool.release.gather reads them). A platform without a
valid verdict, one the index lacks, one whose verdict records another platform, or one with a verdict pin tag
overwritten (tampering: release refuses it whatever verdict counts) gets the report's missing record naming
that platform: it shows as failed, never dropped, and never hides behind another platform's pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buildtool.attest.keys import TrustedKeys
from buildtool.common.refs import split_repo
from buildtool.contracts import platforms as platform_table
from buildtool.registry.client import INDEX_TYPES, NotFound, RegistryClient, RegistryError
from buildtool.registry.image_index import read_index
from buildtool.report.rows import UNRECORDED
from buildtool.report.verdict_files import Missing
from buildtool.validate.verdicts import find_verdicts


def fetch_verdicts(dev_refs: Mapping[str, str], trusted: TrustedKeys | None = None,
                   platforms: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """Verdicts stored in the registry for each cell's dev image (cell -> ref), with image sizes, as the
    JSON `save_verdicts` writes (the verdict, typed where it was read, plus `size_bytes`), or a missing
    record (`Missing`) saying why there is none, so a build that never produced an image shows up in the
    report instead of silently vanishing.

    `platforms` (cell -> the platforms the matrix gives it): a platform of a multi-platform cell that the
    dev tag does not hold gets a missing record naming it; a cell it does not name is an error. None: no
    expectation, every platform the tag holds is read.
    """
    trusted = trusted or TrustedKeys()
    found: list[dict[str, Any]] = []
    clients: dict[str, RegistryClient] = {}
    for cell, ref in dev_refs.items():
        if platforms is not None and cell not in platforms:
            raise ValueError(f"no platforms given for {cell}: fetch_verdicts needs the matrix's platforms of every "
                             "cell it reads")
        expected = tuple(platforms[cell]) if platforms is not None else ()
        host, repo, tag = split_repo(ref)
        client = clients.setdefault(host, RegistryClient(host))
        found += _cell_records(_Source(client, cell, ref, repo, trusted), tag, expected)
    return found


@dataclass(frozen=True)
class _Source:
    """Where one cell's verdicts are read: its dev image reference, repository and registry, and the keys trusted."""

    client: RegistryClient
    cell: str
    ref: str
    repo: str
    trusted: TrustedKeys


def _cell_records(src: _Source, tag: str, expected: tuple[str, ...]) -> list[dict[str, Any]]:
    multi = len(expected) > 1
    cell, ref = src.cell, src.ref

    def missing_each(reason: str, digest: str = "") -> list[dict[str, Any]]:
        """One missing record per platform of a multi-platform cell (each is missing), else one."""
        return [_missing(cell, ref, reason, digest, p) for p in (expected if multi else (UNRECORDED,))]

    try:
        body, media_type, digest = src.client.get_manifest(src.repo, tag)
    except NotFound:
        return missing_each(f"no image {ref} in the registry (the build failed or did not run)")
    manifest = _manifest(body, f"{ref} (digest {digest})")
    if media_type not in INDEX_TYPES and "manifests" not in manifest:
        if multi:
            return missing_each(f"{ref} is a single image manifest, but the matrix gives {cell} the platforms "
                                f"{', '.join(expected)}: its dev tag must be an image index; push the cell again",
                                digest)
        return [_image_record(src, digest, body, want=expected[0] if expected else UNRECORDED, in_index=False)]
    try:
        children = read_index(src.client, src.repo, digest)    # by digest: the index read above, even if the tag moved
    except RegistryError as exc:
        return missing_each(f"{ref}: its image index cannot be read: {exc}", digest)
    children = children or {}
    order = list(platform_table.KNOWN)
    names = [*expected, *sorted((p for p in children if p not in expected), key=order.index)]
    records = []
    for name in names:
        child = children.get(name)
        if child is None:
            held = ", ".join(sorted(children, key=order.index)) or "no platform"
            records.append(_missing(cell, ref, f"{ref} is an index of {held}, without a {name} image (the build "
                                               f"of {name} failed or did not run)", digest, name))
            continue
        try:
            child_body, _, _ = src.client.get_manifest(src.repo, child.digest)
        except NotFound:
            # Deleted since the index was read: that platform is missing, the other platforms' verdicts still count.
            records.append(_missing(cell, ref, f"{ref} names a {name} image {child.digest} the registry no longer "
                                               "has; push the cell again", child.digest, name))
            continue
        records.append(_image_record(src, child.digest, child_body, want=name, in_index=True))
    return records


def _image_record(src: _Source, digest: str, body: bytes, want: str, in_index: bool) -> dict[str, Any]:
    """The verdict that counts of one image (a platform manifest of an index, or the tag's single image), read and
    chosen as release reads and chooses it, or a missing record of `want` (the index entry's platform; "" for a
    single image) saying why."""
    cell, ref = src.cell, src.ref
    where = f"{ref} {want} image {digest}" if in_index else ref
    platform = want if in_index else UNRECORDED
    findings = find_verdicts(src.client, src.repo, digest, src.trusted, cell)
    if findings.blocking:
        return _missing(cell, ref, f"{where}: a verdict cannot be read or typed: {findings.blocking[0]}", digest,
                        platform)
    if findings.overwritten:   # tampering: release, verify and reuse refuse the image whatever verdict counts
        return _missing(cell, ref, f"{where}: {findings.tampered(digest)}", digest, platform)
    chosen = findings.chosen
    if chosen is None:
        why = findings.why_none(src.trusted, "no verdict (validation did not run or did not finish)")
        return _missing(cell, ref, f"{where} has {why}", digest, platform)
    verdict = chosen.verdict
    # As release (gates.recorded_platform_problems): the verdict counts for the platform it records. One that
    # records another (or, in an index, none) would be keyed as another platform's row and hide it.
    if (in_index or verdict.schema_ >= 5) and want and verdict.platform != want:
        return _missing(cell, ref, f"{where}: its newest valid verdict records platform "
                                   f"{verdict.platform or '(none: schema 4)'}, not {want}; validate {want} again",
                        digest, platform)
    return {**verdict.to_json(), "size_bytes": _size(_manifest(body, where), where) or None}


def _manifest(body: bytes, what: str) -> dict[str, Any]:
    """A manifest the registry returned, as JSON; a RegistryError naming `what` when it is not a JSON object."""
    try:
        manifest = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{what}: the registry's manifest is not JSON ({exc}); push the image again") from None
    if not isinstance(manifest, dict):
        raise RegistryError(f"{what}: the registry's manifest is not a JSON object; push the image again")
    return manifest


def _size(manifest: dict[str, Any], what: str) -> int:
    """The image's size: the sum of its layers' `size`, each a non-negative integer (else a RegistryError)."""
    layers = manifest.get("layers") or []
    if not isinstance(layers, list):
        raise RegistryError(f"{what}: the registry's manifest has `layers` that is not a list; push the image again")
    total = 0
    for layer in layers:
        size = layer.get("size") if isinstance(layer, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RegistryError(f"{what}: the registry's manifest gives a layer the size {size!r}, not a "
                                "non-negative integer; push the image again")
        total += size
    return total


def _missing(cell: str, ref: str, reason: str, digest: str = "", platform: str = UNRECORDED) -> dict[str, Any]:
    return Missing(missing=True, cell=cell, image=ref, digest=digest, reason=reason, platform=platform).to_json()
