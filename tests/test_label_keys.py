"""Label keys are spelt in one module (buildtool.contracts.label_keys). This test and that module are the
only places that write one out: renaming a key is an edit there and in KEYS below (images already
released carry the old key, so a rename is a decision, not an accident), then `make render`.

The second half refuses a key written anywhere else, the way tests/test_render_quoting.py proves its
own checks can fail: every Python literal and comment, and every template, outside the module is read
for a key's text (`io.dl-images.<...>`, `org.opencontainers.image.<...>`) or a key composed from the
prefix (`f"{label_keys.PREFIX}.cell"`); each one found is listed with its place.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from tests.conftest import REPO
from tests.scan import python_sources

# Every key as images, artifacts and SBOMs carry it: the one other place a key is spelt.
KEYS = {
    "PREFIX": "io.dl-images",
    "OCI_PREFIX": "org.opencontainers.image",
    "OCI_TITLE": "org.opencontainers.image.title",
    "OCI_DESCRIPTION": "org.opencontainers.image.description",
    "OCI_VERSION": "org.opencontainers.image.version",
    "OCI_SOURCE": "org.opencontainers.image.source",
    "OCI_REVISION": "org.opencontainers.image.revision",
    "OCI_CREATED": "org.opencontainers.image.created",
    "OCI_BASE_NAME": "org.opencontainers.image.base.name",
    "OCI_BASE_DIGEST": "org.opencontainers.image.base.digest",
    "OCI_AUTHORS": "org.opencontainers.image.authors",
    "OCI_URL": "org.opencontainers.image.url",
    "OCI_DOCUMENTATION": "org.opencontainers.image.documentation",
    "OCI_VENDOR": "org.opencontainers.image.vendor",
    "OCI_LICENSES": "org.opencontainers.image.licenses",
    "CELL": "io.dl-images.cell",
    "FRAMEWORK": "io.dl-images.framework",
    "FRAMEWORK_VERSION": "io.dl-images.framework-version",
    "PYTHON": "io.dl-images.python",
    "ACCELERATOR": "io.dl-images.accelerator",
    "CUDA": "io.dl-images.cuda",
    "TESTS": "io.dl-images.tests",
    "RUN_FLAGS": "io.dl-images.run.flags",
    "CONTENT_KEY": "io.dl-images.content-key",
    "RUN_PROFILE": "io.dl-images.run-profile",
    "PACKAGES": "io.dl-images.packages",
    "PACKAGE_PREFIX": "io.dl-images.package.",
    "BASE_REF": "io.dl-images.base.ref",
    "BASE_SOURCE": "io.dl-images.base.source",
    "BASE_ARCHIVE": "io.dl-images.base.archive",
    "BASE_UPSTREAM": "io.dl-images.base.upstream",
    "BUILD_BASE_DIGEST": "io.dl-images.build-base.digest",
    "STANDIN": "io.dl-images.standin",
    "STANDIN_PREFIX": "io.dl-images.standin",
    "STANDIN_FRAMEWORK": "io.dl-images.standin.framework-version",
    "STANDIN_PYTHON": "io.dl-images.standin.python",
    "STANDIN_FOR": "io.dl-images.standin.for",
    "FIXTURE": "io.dl-images.fixture",
    "FIXTURE_FAULT": "io.dl-images.fixture.fault",
    "IMAGETEST_RUN": "io.dl-images.imagetest.run",
    "IMAGETEST_OWNER": "io.dl-images.imagetest.owner",
    "VERDICT_RESULT": "io.dl-images.verdict.result",
    "VERDICT_CELL": "io.dl-images.verdict.cell",
    "VERDICT_SIGNER": "io.dl-images.verdict.signer",
    "SBOM_DIGEST": "io.dl-images.sbom.digest",
    "ARTIFACT_CREATED": "org.opencontainers.image.created",
    "ARTIFACT_TITLE": "org.opencontainers.image.title",
    "LOCK_TOKEN": "io.dl-images.lock.token",
    "LOCK_HOST": "io.dl-images.lock.host",
    "LOCK_PID": "io.dl-images.lock.pid",
    "LOCK_PURPOSE": "io.dl-images.lock.purpose",
    "LOCK_EXPIRES": "io.dl-images.lock.expires",
    "LOCK_RELEASED": "io.dl-images.lock.released",
    "SBOM_PROPERTY": "io.dl-images",
}

MODULE = Path("buildtool/contracts/label_keys.py")
THIS = Path("tests/test_label_keys.py")
SCANNED_PY = ("buildtool", "image-tests", "tests", "bench", "scripts")
SCANNED_TEMPLATES = ("templates", "buildtool")
# The prefixes every key starts with, taken from the module (a rename of a prefix needs no edit here).
_KEY_TEXT = re.compile("|".join(re.escape(p) + r"\.[A-Za-z]" for p in (label_keys.PREFIX, label_keys.OCI_PREFIX)))
_PREFIX_NAMES = frozenset({"PREFIX", "OCI_PREFIX"})
_TEMPLATE_PREFIX = re.compile(r"\blabel_keys\.(?:OCI_)?PREFIX\b")


def test_every_key_is_pinned() -> None:
    declared = {n: v for n, v in vars(label_keys).items() if n.isupper() and isinstance(v, str)}
    assert declared == KEYS


def test_the_matrix_oci_keys_are_the_schema_fields_and_pinned_keys() -> None:
    from buildtool.matrix.schema import OciLabels

    assert list(label_keys.OCI_FROM_MATRIX) == list(OciLabels.model_fields)
    assert set(label_keys.OCI_FROM_MATRIX.values()) <= set(KEYS.values())
    assert all(key == f"{KEYS['OCI_PREFIX']}.{name}" for name, key in label_keys.OCI_FROM_MATRIX.items())


def test_the_facts_checked_in_images_are_declared_keys() -> None:
    keys = set(KEYS.values())
    assert set(label_keys.FACTS) <= keys and set(label_keys.FACTS) >= label_keys.UPSTREAM_CLAIMS


def _python_literals(path: Path, text: str) -> list[str]:
    """Keys spelt in string literals or comments, and keys composed from a prefix in code. A literal or comment
    is a piece of the text, and a prefix is used by its name: a file whose text has neither is not tokenized
    or parsed (most files are not; doing both to every file took seconds)."""
    found = []
    if _KEY_TEXT.search(text):
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            match = _KEY_TEXT.search(token.string) if token.type in (tokenize.STRING, tokenize.COMMENT) else None
            if match is not None:
                line = token.start[0] + token.string.count("\n", 0, match.start())
                found.append(f"{path}:{line}: {match.group(0)}... in {token.string.strip()[:70]}")
    if not any(name in text for name in _PREFIX_NAMES):
        return found
    tree = ast.parse(text)
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "buildtool.contracts.label_keys" for a in node.names}
    for node in ast.walk(tree):
        uses_prefix = ((isinstance(node, ast.Attribute) and node.attr in _PREFIX_NAMES
                        and isinstance(node.value, ast.Name) and node.value.id == "label_keys")
                       or (isinstance(node, ast.Name) and node.id in _PREFIX_NAMES & imported))
        if uses_prefix:
            found.append(f"{path}:{node.lineno}: a key composed from the prefix: {ast.unparse(node)}")
    return found


def _template_literals(path: Path, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in (_KEY_TEXT, _TEMPLATE_PREFIX):
            match = pattern.search(line)
            if match:
                found.append(f"{path}:{number}: {match.group(0)}... in {line.strip()[:70]}")
    return found


def key_literals(root: Path) -> list[str]:
    """Every key written out, or composed from the prefix, outside the label-key module and this test."""
    found: list[str] = []
    for rel, text in python_sources(root, SCANNED_PY, (MODULE, THIS)):
        found += _python_literals(rel, text)
    for top in SCANNED_TEMPLATES:
        for path in sorted((root / top).rglob("*.j2")):
            found += _template_literals(path.relative_to(root), path.read_text(encoding="utf-8"))
    return found


# Folders that hold no document of the project (git's own, virtual environments, tools' caches, the local
# registry's storage): not walked, so a checkout with a .venv and .state/ is read as fast as a fresh clone.
_NOT_DOCUMENTS = frozenset({".git", ".venv", ".state", ".mypy_cache", ".pytest_cache", ".ruff_cache", "__pycache__",
                            "node_modules"})


def _documents(root: Path) -> Iterator[Path]:
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in _NOT_DOCUMENTS]
        yield from (Path(folder) / name for name in files if name.endswith(".md"))


def key_mentions(root: Path) -> list[str]:
    """Keys the Markdown documents name (for people, so spelt out) that the module does not declare:
    after a rename, the documents still naming the old key."""
    declared = set(KEYS.values())
    mention = re.compile(_KEY_TEXT.pattern.replace(r"\.[A-Za-z]", r"\.[a-z][a-z0-9.-]*[a-z0-9]"))
    found = []
    for path in sorted(_documents(root)):
        rel = path.relative_to(root)
        if rel.parts[:2] == ("docs", "releases"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{rel}:{number}: {m.group(0)}" for m in mention.finditer(line) if m.group(0) not in declared]
    return found


def test_the_documents_name_only_declared_keys() -> None:
    found = key_mentions(REPO)
    assert found == [], "documents name label keys that buildtool.contracts.label_keys does not declare:\n" + \
        "\n".join(found)


def test_no_label_key_is_written_outside_its_module() -> None:
    found = key_literals(REPO)
    assert found == [], "label keys written out; use buildtool.contracts.label_keys:\n" + "\n".join(found)


@pytest.mark.parametrize(("name", "source", "expected"), [
    ("a.py", 'labels = {"io.dl-images.cell": "x"}\n', 'a.py:1: io.dl-images.c... in "io.dl-images.cell"'),
    ("a.py", 'key = "org.opencontainers.image.revision"\n', "a.py:1: org.opencontainers.image.r..."),
    ("a.py", "# the io.dl-images.packages label\n", "a.py:1: io.dl-images.p... in # the io.dl-images.packages label"),
    ("a.py", '"""Reads `io.dl-images.run-profile`."""\n', "a.py:1: io.dl-images.r..."),
    ("a.py", 'from buildtool.contracts import label_keys\nk = f"{label_keys.PREFIX}.framework"\n',
     "a.py:2: a key composed from the prefix: label_keys.PREFIX"),
    ("a.py", 'from buildtool.contracts.label_keys import OCI_PREFIX\nk = OCI_PREFIX + ".created"\n',
     "a.py:2: a key composed from the prefix: OCI_PREFIX"),
    ("t.j2", "LABEL io.dl-images.cuda={{ cell.cuda }}\n", "t.j2:1: io.dl-images.c..."),
    ("t.j2", "LABEL {{ label_keys.PREFIX }}.cuda=x\n", "t.j2:1: label_keys.PREFIX..."),
])
def test_the_scan_finds_each_way_of_spelling_a_key(name: str, source: str, expected: str, tmp_path: Path) -> None:
    """The negative control: each spelling, planted in a file of its own, is found and placed."""
    folder = tmp_path / ("buildtool" if name.endswith(".py") else "templates")
    folder.mkdir()
    (folder / name).write_text(source)
    [found] = key_literals(tmp_path)
    assert found.startswith(f"{folder.name}/{expected}")


def test_what_is_not_a_key_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "buildtool").mkdir()
    (tmp_path / "buildtool" / "ok.py").write_text(
        'from buildtool.contracts import label_keys\nPREFIX = "t-imgtest"\nref = f"{PREFIX}-x"\n'
        'url = "https://github.com/dl-images/dl-images"\nk = label_keys.CELL\n')
    assert key_literals(tmp_path) == []


def test_a_document_naming_an_undeclared_key_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("the `io.dl-images.cell` label\nthe `io.dl-images.cell-name` label\n")
    assert key_mentions(tmp_path) == ["docs/a.md:2: io.dl-images.cell-name"]
