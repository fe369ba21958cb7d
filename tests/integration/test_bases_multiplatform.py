"""`fill_bases` for a cell built for linux/amd64 and linux/arm64, against the real engine, the local registry
and QEMU (binfmt_misc, scripts/setup-tests.sh registers it), under a repository prefix of its own: an amd64-only
run makes a single base; the two-platform run keeps that image as the amd64 child by digest and adds an arm64
one made by mmdebstrap; the tag is then an OCI index over both, the arm64 child runs as aarch64, and a third
run finds both present. About 5 minutes here: two mmdebstraps, the arm64 one under QEMU."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import subprocess
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.common.refs import split_repo
from buildtool.imagebuild import base_index
from buildtool.imagebuild.bases import fill_bases
from buildtool.matrix.plan import mirror_base
from buildtool.registry.client import OCI_INDEX, RegistryClient, RegistryError
from tests.conftest import fixture_matrix

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
LOCAL = "127.0.0.1:5000"
BOTH = ("linux/amd64", "linux/arm64")
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_an_amd64_base_becomes_an_index_with_an_arm64_child_that_runs_as_aarch64(tmp_path: Path):
    mirror = f"{LOCAL}/wt-bases-{secrets.token_hex(4)}"   # mirror_base puts the upstream path under it
    cell = next(c for c in fixture_matrix().cells if c.standin is None and c.base.startswith("docker.io/library/"))
    single, multi = cell, dataclasses.replace(cell, platforms=BOTH)
    ref = mirror_base(cell.base, mirror)
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    logged: list[str] = []
    amd64 = arm64 = ""
    try:
        first = fill_bases([single], mirror, force=False, log=logged.append, log_dir=tmp_path, templates=TEMPLATES)
        assert [(r.platform, r.action) for r in first] == [("linux/amd64", "mmdebstrap")]
        amd64 = first[0].digest

        second = {r.platform: r for r in fill_bases([multi], mirror, force=False, log=logged.append,
                                                     log_dir=tmp_path, templates=TEMPLATES)}
        assert (second["linux/amd64"].action, second["linux/amd64"].digest) == ("present", amd64), \
            "the current amd64 base was not kept as the amd64 child"
        assert second["linux/arm64"].action == "mmdebstrap"
        arm64 = second["linux/arm64"].digest
        print(f"arm64 mmdebstrap + write: {second['linux/arm64'].seconds:.0f} s;",
              "; ".join(line for line in logged if "linux/arm64" in line))

        raw = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"],
                                        capture_output=True, text=True, check=True, timeout=120).stdout)
        assert raw["mediaType"] == OCI_INDEX
        assert {(m["platform"]["os"], m["platform"]["architecture"]): m["digest"] for m in raw["manifests"]} == \
            {("linux", "amd64"): amd64, ("linux", "arm64"): arm64}
        assert base_index.platform_manifest(client, repo, tag, "linux/arm64")[1]["architecture"] == "arm64"

        uname = docker_cli.docker("run", "--rm", "--network", "none", "--platform", "linux/arm64",
                                  f"{host}/{repo}@{arm64}", "uname", "-m", timeout=300)
        assert uname.stdout.strip() == "aarch64", uname

        third = fill_bases([multi], mirror, force=False, log=logged.append, log_dir=tmp_path, templates=TEMPLATES)
        assert [(r.platform, r.action, r.digest) for r in third] == [("linux/amd64", "present", amd64),
                                                                    ("linux/arm64", "present", arm64)]
    finally:
        for image in (ref, f"{host}/{repo}@{arm64}" if arm64 else ""):
            if image:
                docker_cli.docker("rmi", "-f", image, timeout=120)
        # Ours alone (a prefix of its own): the index and both children, so nothing of this run stays tagged.
        with contextlib.suppress(RegistryError):
            for digest in {client.manifest_digest(repo, tag), amd64, arm64} - {None, ""}:
                client.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 200, 404), repo=repo)
