"""Which earlier dev images a build may take layers from (BuildKit's registry cache; docs/contents.md, Fresh
runners). A build imports the inline cache of the newest earlier dev images of its cell (`--cache-from`), so a
fresh runner re-runs only the steps whose inputs changed. A cache source puts its layers into the image as surely
as the base does (cache poisoning: anyone who can push a tag could offer layers under our steps' cache keys), so a
dev image is one only when its provenance verifies with a builder key this build trusts, and it is named by
digest, so its tag cannot move between that check and the build. The pushed image carries no cache
(repro_config keeps it apart): the build imports the cache manifest its signed provenance names as a byproduct.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from buildtool.attest.provenance_store import find_provenance
from buildtool.attest.trust import Trusted
from buildtool.contracts import label_keys
from buildtool.registry.client import RegistryClient

# The newest two: last night's image, and the one before in case last night's was built on another base.
CACHE_SOURCES = 2


@dataclass(frozen=True)
class Candidate:
    """An earlier dev image of the cell, as the content-key scan of the registry saw it."""

    tag: str
    digest: str
    labels: dict[str, str]


def newest_first(candidates: Iterable[Candidate]) -> list[Candidate]:
    """By the image's created label (RFC 3339 in UTC, so it sorts as text), newest first; an image
    without one last; ties by tag so the order never depends on the registry's listing."""
    listed = sorted(candidates, key=lambda c: c.tag)
    return sorted(listed, key=lambda c: c.labels.get(label_keys.OCI_CREATED, ""), reverse=True)


def choose(client: RegistryClient, registry_host: str, repo: str, candidates: Iterable[Candidate],
           trusted: Trusted, log: Callable[[str], None], limit: int = CACHE_SOURCES) -> list[str]:
    """Up to `limit` digest-pinned references to use as `--cache-from`, newest first: only images whose
    provenance a trusted builder key signed. Each one passed over is logged with why."""
    chosen: list[str] = []
    seen: set[str] = set()
    for candidate in newest_first(candidates):
        if len(chosen) >= limit:
            break
        # Dev tags of commits that left the cell unchanged name one image: it fills one place, not two.
        if candidate.digest in seen:
            continue
        seen.add(candidate.digest)
        found = find_provenance(client, repo, candidate.digest, trusted)
        if found.provenance is None:
            log(f"not a cache source: {repo}:{candidate.tag} ({candidate.digest[:19]}…): {found.why_none()}")
            continue
        # Its inline cache, kept apart from the image by the push path (repro_config), named by the signed
        # provenance; an image pushed before that carries the cache in its own config.
        cache = found.provenance.inline_cache
        chosen.append(cache.uri.removeprefix("oci://") if cache is not None
                      else f"{registry_host}/{repo}@{candidate.digest}")
    return chosen
