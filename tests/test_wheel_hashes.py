"""Which of a lock entry's several files an image installed (buildtool.imagebuild.wheel_hashes): the
installed wheel's tags against the files the cell's indexes list, with hashes the lock admits. No
network: local find-links folders and file:// indexes, as the host's pip configuration names them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from buildtool.contracts.locks import parse_lock
from buildtool.imagebuild.wheel_hashes import Sources, identify, installed_file
from buildtool.registry import sbom
from tests import sbom_probe

MANY = "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.manylinux_2_28_x86_64"
TAGS = ["cp311-cp311-manylinux2014_x86_64", "cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux_2_28_x86_64"]
FILES = {f"markupsafe-3.0.4-{MANY}.whl": "3" * 64,
         "markupsafe-3.0.4-cp311-cp311-musllinux_1_2_x86_64.whl": "4" * 64,
         "markupsafe-3.0.4.tar.gz": "5" * 64,
         f"markupsafe-3.0.3-{MANY}.whl": "6" * 64}
ADMITTED = ["sha256:" + c * 64 for c in "345"]


def test_the_wheel_with_the_installed_tags_and_an_admitted_hash_is_the_one():
    assert installed_file("MarkupSafe", "3.0.4", TAGS, ADMITTED, FILES) == "3" * 64
    assert installed_file("markupsafe", "3.0.4", TAGS[:2], ADMITTED, FILES) is None     # tags must be all equal
    assert installed_file("markupsafe", "3.0.4", TAGS, ADMITTED[1:], FILES) is None     # hash not admitted
    assert installed_file("markupsafe", "3.0.3", TAGS, ADMITTED, FILES) is None         # another version
    two = dict(FILES, **{f"markupsafe-3.0.4-1-{MANY}.whl": "5" * 64})                 # a build tag: ambiguous
    assert installed_file("markupsafe", "3.0.4", TAGS, ADMITTED, two) is None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_local_indexes_and_find_links_identify_the_file(tmp_path: Path):
    wheel = b"not really a zip; only its bytes' hash matters"
    links = tmp_path / "wheels"
    links.mkdir()
    (links / f"markupsafe-3.0.4-{MANY}.whl").write_bytes(wheel)
    (links / "markupsafe-3.0.4-cp311-cp311-musllinux_1_2_x86_64.whl").write_bytes(b"other")
    index = tmp_path / "simple"
    (index / "werkzeug").mkdir(parents=True)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "werkzeug-3.1.9-py3-none-any.whl").write_bytes(b"werkzeug wheel")
    (index / "werkzeug" / "index.html").write_text(    # one link with its hash, one without (hashed here)
        '<a href="../../files/werkzeug-3.1.9-py3-none-any.whl">werkzeug-3.1.9-py3-none-any.whl</a>\n'
        f'<a href="x/werkzeug-3.1.9.tar.gz#sha256={"7" * 64}">werkzeug-3.1.9.tar.gz</a>')
    locks = {"tools.lock": parse_lock(
        f"markupsafe===3.0.4 \\\n    --hash=sha256:{_sha(wheel)} \\\n    --hash=sha256:{_sha(b'other')}\n"
        f"werkzeug===3.1.9 \\\n    --hash=sha256:{_sha(b'werkzeug wheel')} \\\n    --hash=sha256:{'7' * 64}\n"
        f"numpy===2.4.6 \\\n    --hash=sha256:{'8' * 64} \\\n    --hash=sha256:{'9' * 64}\n")}
    python = {"markupsafe": {"version": "3.0.4", "wheel_tags": TAGS},
              "werkzeug": {"version": "3.1.9", "wheel_tags": ["py3-none-any"]},
              "numpy": {"version": "2.4.6", "wheel_tags": ["cp311-cp311-linux_x86_64"]}}   # listed nowhere
    lines: list[str] = []
    found = identify(python, locks, Sources(indexes=(index.as_uri(),), find_links=(str(links),)), lines.append)
    assert found == {"markupsafe": _sha(wheel), "werkzeug": _sha(b"werkzeug wheel")}
    assert lines == []


def test_an_unreachable_index_is_said_once_and_identifies_nothing():
    lines: list[str] = []
    locks = {"tools.lock": parse_lock(sbom_probe.TOOLS_LOCK)}
    python = {"markupsafe": {"version": "3.0.4", "wheel_tags": TAGS}}
    found = identify(python, locks, Sources(indexes=("http://127.0.0.1:9/simple",), find_links=()), lines.append)
    assert found == {} and len(lines) == 1 and "127.0.0.1:9/simple cannot be reached" in lines[0]


def test_the_sbom_carries_the_identified_hash_and_refuses_one_the_lock_does_not_admit():
    def doc(identified: dict[str, str]) -> dict:
        return sbom.make_sbom(sbom_probe.probe(), repository="r/x", digest="sha256:" + "d" * 64, facts={},
                              locks=sbom_probe.LOCKS, identified=identified, indexes=sbom_probe.INDEXES)

    [markupsafe] = [c for c in doc({"markupsafe": "4" * 64})["components"] if c["name"] == "markupsafe"]
    assert markupsafe["hashes"] == [{"alg": "SHA-256", "content": "4" * 64}]
    assert not any(p["name"].endswith(":hash") for p in markupsafe["properties"])
    with pytest.raises(ValueError, match="markupsafe: the file identified as installed .* is not one tools.lock"):
        doc({"markupsafe": "9" * 64})
