"""Promote tested dev images to release tags, digest for digest, inside the registry.

For each chosen cell: find the dev image of the commit (`<name>-dev:<sha>-<version>`), check the gates
(buildtool.release.gates), then give the same digest its release tags in the release repository, with the
signed verdict, SBOM and provenance of each platform manifest attached to the same digests. Blobs are linked
by cross-repository mounts (uploaded through this machine where the registry declines one, which the report
says; the dry run says where that is known or likely: release.tag_plan.mount_outlook); indexes are copied
whole, child manifests first, so the index digest is unchanged.

All images are gated before anything is written; one refusal promotes nothing. Version tags
are immutable (never moved, not even with --force); `--force` moves only the matrix's moving
tags, and is needed only to move them to an older release.

Distribution registries have no compare-and-swap on tags: each release repository is locked (`RepoLock`),
every tag is compared before it is written and verified after, and a final re-check under the lock puts back
a moving tag that a late write moved (docs/release-trust.md, "Re-running, and writes that land late").

This module only orders the steps: release.model (the data), release.read (registry reads), release.gather
(one image gated, read-only), release.tag_plan (the tag plan and other pure decisions), release.repo_lock
(`RepoLock`), release.execute (the writes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from buildtool.matrix.plan import Settings, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.release.execute import promote_all
from buildtool.release.gates import Platform, check_version
from buildtool.release.gather import finish_gate, gather
from buildtool.release.model import ImageRelease, ReleaseOptions, ReleaseReport, TagAction
from buildtool.release.package_changes import package_section, packages_entry, subjects
from buildtool.release.read import READ_THREADS, plan_item, read_standins, read_tag_state
from buildtool.release.repo_lock import LOCK_TAG
from buildtool.release.tag_plan import check_plans, mount_outlook, settle_unpromoted, writes_needed

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

__all__ = ["LOCK_TAG", "ImageRelease", "Platform", "ReleaseOptions", "ReleaseReport", "TagAction", "release"]


def release(cells: list[Cell], settings: Settings, options: ReleaseOptions,
            client_for: Callable[[str], RegistryClient] = RegistryClient,
            matrix_cells: Sequence[Cell] | None = None) -> ReleaseReport:
    """Gate every image, then promote them all; the report says what was and was not done.
    `matrix_cells`: every cell of the matrix (its stand-ins are checked), default `cells`."""
    version = check_version(options.version)
    plans = [plan_cell(c, settings, options.revision, version) for c in cells]
    host = check_plans(plans)
    client = client_for(host)
    client.ping()
    report = ReleaseReport(version, options.revision, [], options.dry_run)
    # Everything before the first write is reads: done side by side (stand-ins, each image and its
    # verdict, each release repository's tags, the SBOMs), then judged in matrix order.
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="release-read") as pool:
        standins_job = pool.submit(read_standins, client, settings, matrix_cells or cells)
        items = [pool.submit(gather, client, p, options, None, False) for p in plans]
        states = [pool.submit(read_tag_state, client, p, version) for p in plans]
        standins, standin_problems = standins_job.result()
        sboms = []
        for job, state, p in zip(items, states, plans, strict=True):
            item = job.result()
            finish_gate(item, p, standins, standin_problems)
            if item.status == "ready":
                plan_item(client, item, p, version, options.force, state=state.result())
                if options.dry_run and writes_needed(item) and (outlook := mount_outlook(p, item.size)):
                    item.transfer.append(outlook)
                # Each platform's SBOM, compared with the same platform's in the previous release.
                found = subjects(item)
                sboms.append((item, found, [pool.submit(package_section, client, s, p.dev_repo, p.release_repo)
                                            for s in found]))
            report.images.append(item)
        for item, found, sections in sboms:
            item.packages = packages_entry(found, [s.result() for s in sections])
    if report.refused or options.dry_run:
        settle_unpromoted(report)
        return report
    promote_all(client, report, plans, options)
    return report
