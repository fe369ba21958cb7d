"""Which of a lock entry's several wheels an image installed (buildtool.contracts.locks.installed_files): the
installed wheel's tags (its WHEEL file) against the file names the pylock.toml lists with their sha256. The
lock names every file, so no index is asked. (Moved from test_wheel_hashes.py, which asked the indexes.)"""

from __future__ import annotations

import pytest
import requests

from buildtool.contracts.locks import TOOLS_LOCK, installed_files, parse_lock
from buildtool.sbom import document as sbom
from tests import sbom_probe
from tests.pylocks import pylock
from tests.sbom_probe import MANY

TAGS = ["cp311-cp311-manylinux2014_x86_64", "cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux_2_28_x86_64"]
WHEELS = [(f"markupsafe-3.0.4-{MANY}.whl", "3" * 64),
          ("markupsafe-3.0.4-cp311-cp311-musllinux_1_2_x86_64.whl", "4" * 64),
          ("markupsafe-3.0.4-py3-none-any.whl", "5" * 64)]


def _locks(wheels: list[tuple[str, str]]) -> dict:
    return {TOOLS_LOCK: parse_lock(pylock({"markupsafe": ("3.0.4", wheels)}))}


def test_the_wheel_with_the_installed_tags_is_the_one():
    def found(version: str, tags: list[str], wheels: list[tuple[str, str]] = WHEELS) -> dict[str, str]:
        return installed_files({"markupsafe": {"version": version, "wheel_tags": tags}}, _locks(wheels))

    assert found("3.0.4", TAGS) == {"markupsafe": "3" * 64}
    assert found("3.0.4", TAGS[:2]) == {}                       # tags must be all equal
    assert found("3.0.3", TAGS) == {}                           # another version than the lock's
    two = [*WHEELS, (f"markupsafe-3.0.4-1-{MANY}.whl", "6" * 64)]   # a build tag: two files, same tags
    assert found("3.0.4", TAGS, two) == {}


def test_identification_asks_no_index(monkeypatch: pytest.MonkeyPatch):
    """The lock lists each wheel's file name and sha256: nothing is fetched (any request fails here)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an index was asked")

    monkeypatch.setattr(requests, "get", refuse)
    monkeypatch.setattr(requests.Session, "request", refuse)
    locks = {TOOLS_LOCK: parse_lock(pylock({
        "markupsafe": ("3.0.4", WHEELS),
        "werkzeug": ("3.1.9", [("werkzeug-3.1.9-py3-none-any.whl", "7" * 64)]),
        "numpy": ("2.4.6", [("numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", "8" * 64),
                            ("numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl", "9" * 64)])}))}
    python = {"markupsafe": {"version": "3.0.4", "wheel_tags": TAGS},
              "werkzeug": {"version": "3.1.9", "wheel_tags": ["py3-none-any"]},     # one wheel: no lookup needed
              "numpy": {"version": "2.4.6", "wheel_tags": ["cp311-cp311-linux_x86_64"]}}   # listed nowhere
    assert installed_files(python, locks) == {"markupsafe": "3" * 64}


def test_the_sbom_carries_the_identified_hash_and_refuses_one_the_lock_does_not_admit():
    def doc(identified: dict[str, str]) -> dict:
        return sbom.make_sbom(sbom_probe.probe(), repository="r/x", digest="sha256:" + "d" * 64, facts={},
                              locks=sbom_probe.LOCKS, identified=identified, indexes=sbom_probe.INDEXES)

    [markupsafe] = [c for c in doc({"markupsafe": "4" * 64})["components"] if c["name"] == "markupsafe"]
    assert markupsafe["hashes"] == [{"alg": "SHA-256", "content": "4" * 64}]
    assert not any(p["name"].endswith(":hash") for p in markupsafe["properties"])
    with pytest.raises(ValueError, match="markupsafe: the file identified as installed .* is not one pylock.tools"):
        doc({"markupsafe": "9" * 64})
