"""Verify gates an image named by a cell's dev tag as that cell, as release of the cell reads that very tag: an image
of another cell (its label, its provenance and its verdict all of that cell) put at the tag is refused by both, for
the same causes. In-memory registry (tests/memregistry.py)."""

from __future__ import annotations

import dataclasses

from buildtool.contracts import label_keys
from buildtool.matrix.plan import Settings, plan_cell
from buildtool.release.chain import verify_reference
from tests import signing
from tests.test_release_platforms import CPU, REVISION, Dev
from tests.test_verify_strict import checkout

# Another cell of the same image (pytorch-cpu-dev holds both): its dev tags end in -2.14.
NEWER = dataclasses.replace(CPU, version="2.14", framework_version="2.14")


def test_another_cells_image_at_a_cells_dev_tag_is_refused_by_release_and_verify_alike() -> None:
    """Before: verify gated the image as the cell its label names (pytorch-cpu:2.13), found the tag no dev tag of
    that cell, and said "verified"; release of pytorch-cpu:2.14, which reads that tag, refused it."""
    dev = Dev(CPU)
    digest = dev.validated("amd64")
    newer = Dev(NEWER)
    newer.client, newer.repo = dev.client, dev.repo
    settings = Settings(registry=f"{dev.client.host}/t", release_registry=f"{dev.client.host}/t/rel")
    newer.plan = plan_cell(NEWER, settings, REVISION, "0.1.0")
    assert newer.plan.dev_repo == dev.plan.dev_repo and newer.plan.dev_tag != dev.plan.dev_tag
    raw, media_type, _ = dev.client.get_manifest(dev.repo, digest)
    dev.client.put_manifest(dev.repo, newer.plan.dev_tag, raw, media_type)
    item = newer.gather()
    assert item.status == "refused"
    assert f"{digest} is labelled {label_keys.CELL}={CPU.key}, not {NEWER.key}" in item.problems, item.problems
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{newer.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), dataclasses.replace(checkout(CPU), cells=[CPU, NEWER]))
    assert not found.ok and found.cell == NEWER.key and found.gated
    assert found.all_problems == item.problems, (found.all_problems, item.problems)


def test_an_image_at_its_own_cells_dev_tag_is_still_gated_as_its_cell() -> None:
    dev = Dev(CPU)
    digest = dev.validated("amd64")
    raw, media_type, _ = dev.client.get_manifest(dev.repo, digest)
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, raw, media_type)
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), dataclasses.replace(checkout(CPU), cells=[CPU, NEWER]))
    assert found.ok and found.cell == CPU.key, found.all_problems
