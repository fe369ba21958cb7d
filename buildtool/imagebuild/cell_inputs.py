"""What a cell's build is made of, before any engine runs: its base (BaseInfo), its content key, the labels the
build adds, the build's secrets to scrub from its log, and which local images were built for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from buildtool.common.errors import UserError
from buildtool.common.files import write_atomic
from buildtool.common.refs import ReferenceError, parse_reference
from buildtool.contracts.image_labels import ImageLabels, LabelError, RunProfile
from buildtool.contracts.names import check_full_revision, parse_dev_tag
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.plan import CellPlan, content_key


@dataclass(frozen=True)
class BaseInfo:
    ref: str        # what the build pulls (the mirror when BASE_MIRROR is set)
    digest: str
    labels: dict[str, str] = field(default_factory=dict)
    # A multi-platform cell's build machine image of the same base (BUILD_BASE_IMAGE), which its native stages run on
    # (None: a cell without them, or an image labelled before the content key covered it).
    build: BaseInfo | None = None

    @property
    def pinned(self) -> str:
        # The name without its tag or digest (a registry's `:port` is neither), then the resolved digest.
        return f"{parse_reference(self.ref).name}@{self.digest}"


def cell_content_key(plan: CellPlan, root: Path, base: BaseInfo, platform: str | None = None) -> str:
    """The content key of the cell's image (of a multi-platform cell: of its `platform` image, on that
    platform's base)."""
    dockerfile = root / plan.cell.dockerfile
    settings = {"base": plan.cell.base, **{k: v for k, v in plan.build_args.items() if k != "BASE_IMAGE"}}
    if platform is not None:
        settings["platform"] = platform
    if base.build is not None:
        # The native stages' output is copied into the image, and what they make depends on the build machine's image
        # of the base, not only on the locks: an NGC cell's tools are installed by that image's own Python (its
        # version writes the bytecode, its path the scripts' first lines, its site-packages where files go), a pip
        # cell's venv by the Python the build platform's apt.lock pins. So its digest (one per platform) is part of
        # the key: another build machine's base, or a machine of another platform, is another key, never a reuse.
        settings["build_base"] = base.build.digest
    # Every file in the build context (the Dockerfile's folder) that a COPY could use.
    context = {str(p.relative_to(dockerfile.parent)): p.read_bytes() for p in sorted(dockerfile.parent.rglob("*"))
               if p.is_file() and p != dockerfile}
    return content_key(dockerfile.read_bytes(), base.digest, settings, context)


def build_labels(plan: CellPlan, base: BaseInfo, key: str, revision: str, source: str,
                 locked: dict[str, str] | None = None) -> dict[str, str]:
    """The labels `buildtool build` adds (contracts.image_labels writes them; the templates write the rest).
    `revision`: the full commit (`names.check_full_revision`). `locked`: what the locks install, which the
    contents check and the SBOM step prove inside the image. The base is named as the build pulled it
    (`base.ref`, the mirror's reference when BASE_MIRROR is set) beside that reference's digest, so the
    pair resolves; the matrix's upstream it stands for is the template's label_keys.BASE_UPSTREAM."""
    cell = plan.cell
    try:
        check_full_revision(revision)
    except ValueError as exc:
        raise UserError(f"{cell.key}: {exc}") from None
    run = RunProfile(shm_size=cell.run.shm_size, ipc=cell.run.ipc, ulimits=tuple(sorted(cell.run.ulimits)),
                     gpus=cell.run.gpus, docker_flags=tuple(cell.run.docker_flags()))
    try:
        on_standin = ImageLabels.parse(base.labels)
    except LabelError as exc:
        raise UserError(f"base {base.ref}: {exc}") from None
    labels = ImageLabels(
        source=source, revision=revision, version=cell.version,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), base_name=base.ref, base_digest=base.digest,
        base_ref=base.ref, cell=cell.key, content_key=key, build_base_digest=base.build.digest if base.build else "",
        run_profile=run,
        packages=None if locked is None else dict(sorted(locked.items())),
    )
    if on_standin.standin:
        labels = replace(labels, standin=True, standin_framework=on_standin.standin_framework or "unknown",
                         standin_python=on_standin.standin_python)
    return labels.to_dict()


def secret_strings(host: HostPip) -> list[str]:
    """Credentials inside index URLs: scrubbed from logs as a second line of defence. The user info is everything
    up to the last `@` (a password may hold an unescaped `/`); a token may also ride in the query or fragment
    (`?token=...`, common.urls): each value there is one too, and each secret as written and percent-decoded (a
    query value also as a form decodes it)."""
    found: list[str] = []
    for url in (host.index_url, *host.extra_index_urls, *host.find_links):
        scheme, sep, rest = url.partition("://")
        if not (scheme and sep):
            continue
        userinfo, at, location = rest.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if at and colon and password:   # the password alone (the log keeps the user name), `user:pw` if it is short
            found.append(password if len(password) >= 4 else userinfo)
        elif at and user:   # `https://TOKEN@host/simple`: the user name is the secret
            found.append(user)
        # Split as urlsplit splits them, but never refused (`https://[bad/simple`: urlsplit's ValueError).
        location, _, fragment = location.partition("#")
        query = location.partition("?")[2]
        # Each value as written (`sig=Ab%2Bc` is what uv and pip print) and as a form decodes it (`+` a space).
        written = [pair.partition("=")[2] for pair in query.split("&")]
        found += [value for value in written if value]
        found += [value for _, value in parse_qsl(query, keep_blank_values=True)]
        found += [fragment] if fragment else []
    found += [unquote(s) for s in found]
    # Longest first: a secret that is part of another (`tok` of `tok-2`) must not mask that one's head only.
    return sorted((s for s in dict.fromkeys(found) if len(s) >= 4), key=len, reverse=True)


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` with each of `secrets` (secret_strings: longest first) replaced by ****."""
    for secret in secrets:
        text = text.replace(secret, "****")
    return text


def scrub_log(path: Path, secrets: list[str]) -> None:
    """The log at `path` with `secrets` scrubbed, rewritten only when they were in it and atomically (its mode
    kept): a later push's provenance reads this log, so a rewrite cut short must never leave it truncated."""
    if not secrets or not path.is_file():
        return
    text = path.read_text(errors="replace")
    scrubbed = scrub(text, secrets)
    if scrubbed != text:
        write_atomic(path, scrubbed)


def built_for(plan: CellPlan, images: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of local images carrying a content key, those this tool built for the cell: tagged in the
    cell's dev repository with one of its dev tags. An image built FROM a dev image inherits all
    its labels, content key included, so the label alone does not say what an image is."""
    repo = parse_reference(f"{plan.dev_repo}:x").name

    def dev_tag(ref: str) -> bool:
        try:
            parsed = parse_reference(ref)
        except ReferenceError:
            return False
        return parsed.name == repo and bool(parse_dev_tag(parsed.tag, plan.cell.version))

    return [image for image in images if any(dev_tag(ref) for ref in image.get("RepoTags") or [])]


