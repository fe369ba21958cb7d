"""The same commit gives the same image digest on two fresh machines (issue 52).

Two machines simulated one after the other on this one (tests/fresh_machine.py): each its own empty Docker
engine (a second dockerd: own data root, exec root, pidfile, socket and bridge), its own empty local registry,
its own config and cache folders, a clone of HEAD. Each makes the Debian base (`buildtool bases`: mmdebstrap at
the archive state deb.debian.org serves, dated by its InRelease) and pushes pytorch-cpu:2.13 (`buildtool build
--push`). Asserted: both read the same archive state (the InRelease sha256 each base's label records: the
precondition; a Debian archive update between the two is named as such, not taken for a fault), the same base
digest, the same pushed image digest; the apt lock the commit carries was resolved in that very base (its
`resolved-in` digest); and each provenance's sourceDateEpoch is the SOURCE_DATE_EPOCH the image's history shows
its RUN steps ran with (the fault issue 52 found: the commit time there, 0 in the history), with the commit
time as createdEpoch, the config's `created`.

Slow (two pytorch-cpu builds from empty caches, about 10 minutes here): marked `slow`; make test runs it.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime

import pytest

from buildtool.attest.provenance_store import find_provenance, only_key
from buildtool.common.net import free_port
from buildtool.contracts import label_keys
from buildtool.contracts.apt_lock_format import parse_apt_lock
from buildtool.contracts.image_labels import parse_archive_label
from buildtool.registry.client import RegistryClient
from tests.fresh_machine import CELL, FreshMachine, head_commit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APT_LOCK = "dockerfiles/pytorch/pytorch-cpu/2.13/apt.lock"
_STEP_EPOCH = re.compile(r"^RUN \|\d+ (?:\S+=\S* )*?SOURCE_DATE_EPOCH=(\d+) ")


def _one_machine(name: str, port: int, net: int, commit: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    with FreshMachine(name, port, net) as machine:
        checkout = machine.checkout(commit)
        seconds, base = machine.make_base(checkout)
        labels = machine.config("library/debian", base)["config"]["Labels"]     # type: ignore[index]
        result = machine.push_cell(checkout)
        assert result["result"] == "built" and str(result["digest"]).startswith("sha256:"), result
        repo = str(result["ref"]).split("/", 1)[1].rsplit(":", 1)[0]
        digest = str(result["digest"])
        config = machine.config(repo, digest)
        # The provenance, verified with the key this machine made and signed with.
        from buildtool.attest.keys import dev_public_key

        with monkeypatch.context() as scoped:   # this machine's config folder, for reading its key only
            scoped.setenv("XDG_CONFIG_HOME", machine.env()["XDG_CONFIG_HOME"])
            key = dev_public_key()
        assert key is not None
        found = find_provenance(RegistryClient(machine.registry), repo, digest, only_key(key))
        assert found.provenance is not None, found.rejected
        lock = parse_apt_lock((checkout / APT_LOCK).read_text())
        return {"base": base, "base_seconds": seconds, "archive": labels[label_keys.BASE_ARCHIVE],
                "recipe": labels[label_keys.BASE_SOURCE], "digest": digest, "config": config,
                "provenance": found.provenance, "resolved_in": lock.header["resolved-in"]}


def test_two_fresh_machines_push_pytorch_cpu_with_the_same_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test starts private dockerds and bridges: run it as root", pytrace=False)
    port, commit = free_port(), head_commit()
    a = _one_machine("a", port, 251, commit, monkeypatch)
    b = _one_machine("b", port, 252, commit, monkeypatch)
    print(f"\nbase step: {a['base_seconds']:.1f} s and {b['base_seconds']:.1f} s; bases {a['base']} {b['base']}; "
          f"{CELL}: {a['digest']} {b['digest']}; archive {a['archive']}")
    # The precondition: the same archive state (deb.debian.org did not publish between the two).
    assert a["archive"] == b["archive"], ("the Debian archive changed between the two machines (a point release "
                                          f"or update): {a['archive']} then {b['archive']}; run again")
    uri, _, _ = parse_archive_label(str(a["archive"]))
    assert uri == "http://deb.debian.org/debian/dists/bookworm/InRelease"
    assert str(a["recipe"]).startswith("mmdebstrap --variant=minbase bookworm, recipe ")
    assert a["base"] == b["base"], "two machines given the same archive state made different bases"
    assert a["digest"] == b["digest"], f"the same commit pushed {a['digest']} and {b['digest']}"
    # The apt lock was resolved in the base the image is built on.
    assert str(a["resolved_in"]).split(" ", 1)[0].endswith(f"@{a['base']}"), (a["resolved_in"], a["base"])
    for run in (a, b):
        provenance = run["provenance"]
        params = provenance.buildDefinition.externalParameters    # type: ignore[attr-defined]
        history = run["config"]["history"]                       # type: ignore[index]
        ran_with = {int(m.group(1)) for h in history if (m := _STEP_EPOCH.match(h.get("created_by", "")))}
        assert ran_with == {params.sourceDateEpoch}, (ran_with, params.sourceDateEpoch)
        created = int(datetime.strptime(run["config"]["created"], "%Y-%m-%dT%H:%M:%SZ")  # type: ignore[index]
                      .replace(tzinfo=UTC).timestamp())
        assert params.createdEpoch == created
        base = provenance.base                                  # type: ignore[attr-defined]
        assert base.digest == {"sha256": str(run["base"]).removeprefix("sha256:")}
        assert base.annotations["archive"]["uri"] == uri and "upstreamDigest" not in base.annotations
