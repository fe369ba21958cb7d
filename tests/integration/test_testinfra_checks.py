"""Issue 54 in a real container: the checks that inspect the image run through testinfra's `host` and are named
in the verdict, and a site folder of two checks (one passing, one failing on purpose) counts in the verdict like
the others: its group and tests are named there, the failing one fails it, and its test code covers the folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.validate.collect import image_tests_hash  # noqa: E402
from buildtool.validate.runner import Options, validate_image  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
# The checks of the common group written with testinfra's `host` (image-tests/README.md lists them).
TESTINFRA = ("test_locked_packages_installed_at_their_versions", "test_extra_packages", "test_nvidia_runtime_variables",
             "test_image_user_can_write_in_its_workdir", "test_image_user_can_write_tmp",
             "test_image_user_can_write_its_home", "test_ulimit[stack]", "test_shm_size_matches_run_profile",
             "test_socket_interfaces_are_not_pinned_to_loopback", "test_proxies_leave_local_traffic_local",
             "test_python_trusts_the_system_ca_certificates", "test_tensorboard_listens_on_loopback_only",
             "test_labels_state_the_image_contents")
SITE = {"test_site.py": '''"""acme's own checks: its CA bundle and its InfiniBand userspace."""


def test_acme_base_files_are_there(host):
    assert host.file("/etc/os-release").contains("bookworm"), host.file("/etc/os-release").content_string


def test_acme_needs_the_infiniband_verbs_library(host):
    verbs = host.package("libibverbs1")
    assert verbs.is_installed, "acme's nodes need libibverbs1 (RDMA userspace), which the image lacks"
'''}


def test_testinfra_checks_and_a_site_folder_in_the_verdict(tmp_path):
    image = fixture_images.ensure("pytorch")
    site = tmp_path / "acme"
    site.mkdir()
    for name, text in SITE.items():
        (site / name).write_text(text)
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    verdict = validate_image(image, matrix, REPO, Options(store=False, reports=tmp_path / "reports", extra_tests=site),
                             log=lambda line: None)
    found = {t["id"].split("::")[-1]: t for t in verdict["tests"]}
    print({k: v["result"] for k, v in found.items()})
    assert [n for n in TESTINFRA if found[n]["result"] == "passed"] == list(TESTINFRA), \
        {n: found[n]["message"] for n in TESTINFRA}
    # The site's checks: their group and ids in the verdict, one passed, the one failing on purpose fails it.
    assert verdict["groups"] == ["common", "pytorch", "acme"]
    ids = {"acme/test_site.py::test_acme_base_files_are_there", "acme/test_site.py::test_acme_needs_the_infiniband_"
           "verbs_library"}
    assert ids <= set(verdict["defined_tests"]), verdict["defined_tests"]
    site_results = {t["id"]: t for t in verdict["tests"] if t["group"] == "acme"}
    assert set(site_results) == ids
    assert site_results["acme/test_site.py::test_acme_base_files_are_there"]["result"] == "passed"
    failing = site_results["acme/test_site.py::test_acme_needs_the_infiniband_verbs_library"]
    assert failing["result"] == "failed" and failing["message"].startswith(
        "acme's nodes need libibverbs1 (RDMA userspace), which the image lacks"), failing
    others = [t["id"] for t in verdict["tests"] if t["result"] == "failed" and t["group"] != "acme"]
    assert not others, others
    assert verdict["result"] == "failed"
    # The test code is image-tests with the site folder, not image-tests alone.
    assert verdict["test_code"] != image_tests_hash(REPO / "image-tests")
