"""Where the documents list the frameworks, the list is the folders' (image-tests/<name>/ with a framework.yaml).

The one full list is generated: docs/images.md's Frameworks section (buildtool render, drift-checked by
buildtool check). Prose that names the frameworks does so in a link to it, `[PyTorch, TensorFlow and
JAX](docs/images.md#frameworks)`, whose text must name every framework by its title and nothing else;
the README must have one. image-tests/README.md's table has rows for exactly the groups there are, and
docs/multinode.md's launcher table exactly the launchers registered. A framework added is a folder and its
matrix entry (tests/test_new_framework_copy.py); these checks then name the sentence or table to extend.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from buildtool.contracts import frameworks

REPO = Path(__file__).resolve().parent.parent
# A Markdown link to the catalogue's Frameworks section, from the README or a page beside the catalogue.
_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>(?:docs/|\./|\.\./docs/)?images\.md#frameworks)\)")
_SEPARATORS = re.compile(r"[\s,]*(?:\b(?:and|or)\b[\s,]*)*")


def _rows() -> dict[str, frameworks.Framework]:
    """This checkout's frameworks, read from its folders."""
    return frameworks.load_table(REPO / "image-tests")


def _documents() -> list[Path]:
    return [REPO / "README.md", REPO / "image-tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _named(text: str, titles: list[str]) -> tuple[list[str], str]:
    """The titles TEXT names as whole words, and what is left once they are taken out."""
    named = []
    for title in sorted(titles, key=len, reverse=True):     # "Paddle" inside "PaddlePaddle" is not a match anyway
        pattern = re.compile(rf"(?<![\w-]){re.escape(title)}(?![\w-])")
        if pattern.search(text):
            named.append(title)
            text = pattern.sub(" ", text)
    return named, text


def framework_list_problems(path: Path, titles: list[str], root: Path = REPO) -> list[str]:
    """Each link to the Frameworks section whose text names a framework must name all of them and nothing else."""
    problems = []
    text = path.read_text(encoding="utf-8")
    for match in _LINK.finditer(text):
        named, rest = _named(match["text"], titles)
        if not named:
            continue     # a pointer to the list ("[the frameworks](docs/images.md#frameworks)"), not a list
        line = text.count("\n", 0, match.start()) + 1
        where = f"{path.relative_to(root)}:{line}"
        missing = [t for t in titles if t not in named]
        if missing:
            problems.append(f"{where}: [{match['text']}] does not name {', '.join(missing)}, a framework folder of "
                            "image-tests/")
        if not _SEPARATORS.fullmatch(rest):
            problems.append(f"{where}: [{match['text']}] names something that is no framework: "
                            f"{' '.join(w for w in rest.replace(',', ' ').split() if w not in ('and', 'or'))!r} "
                            f"(the frameworks: {', '.join(titles)})")
    return problems


def test_every_framework_list_in_the_documents_is_the_folders() -> None:
    titles = [row.title for row in _rows().values()]
    assert titles
    problems = [p for path in _documents() if path.is_file() for p in framework_list_problems(path, titles)]
    assert not problems, "\n".join(problems)


def test_the_readme_names_the_frameworks_in_a_link_to_their_list() -> None:
    """The README says which frameworks there are, in words the check above holds to the folders."""
    titles = [row.title for row in _rows().values()]
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lists = [m for m in _LINK.finditer(text) if _named(m["text"], titles)[0]]
    assert lists, ("README.md names the frameworks nowhere in a link to their list: write them as "
                   f"[{_english(titles)}](docs/images.md#frameworks)")


def _english(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


@pytest.mark.parametrize(("text", "problem"), [
    ("for [JAX, PyTorch and TensorFlow](docs/images.md#frameworks):", None),
    ("for [PyTorch, TensorFlow and JAX](docs/images.md#frameworks):", None),
    ("see [the frameworks](docs/images.md#frameworks)", None),
    ("for [PyTorch and TensorFlow](docs/images.md#frameworks)", "does not name JAX"),
    ("for [PyTorch, TensorFlow, JAX and MXNet](docs/images.md#frameworks)", "names something that is no framework: "
                                                                            "'MXNet'"),
])
def test_the_list_check_can_fail(tmp_path: Path, text: str, problem: str | None) -> None:
    page = tmp_path / "README.md"
    page.write_text(f"# x\n\nImages {text}\n")
    found = framework_list_problems(page, ["JAX", "PyTorch", "TensorFlow"], root=tmp_path)
    if problem is None:
        assert found == []
    else:
        [line] = found
        assert line.startswith("README.md:3: [") and problem in line, line


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header row starts with HEADER."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_image_tests_table_has_rows_for_exactly_the_groups() -> None:
    """image-tests/README.md lists every group's test files: common's and each framework folder's, and no other."""
    suite = REPO / "image-tests"
    rows = _table_rows((suite / "README.md").read_text(encoding="utf-8"), "| group | file |")
    listed = {(group, file) for group, file, *_ in rows}
    groups = [frameworks.COMMON_GROUP, *_rows()]
    assert sorted({g for g, _ in listed}) == sorted(groups), (
        "image-tests/README.md's table must have rows for exactly the groups: common and the framework folders")
    on_disk = {(g, p.name) for g in groups for p in (suite / g).glob("test_*.py")}
    assert listed == on_disk, (f"not in the table: {sorted(on_disk - listed)}; in the table, no such file: "
                               f"{sorted(listed - on_disk)}")


def test_the_multinode_page_lists_exactly_the_launchers() -> None:
    rows = _table_rows((REPO / "docs" / "multinode.md").read_text(encoding="utf-8"), "| `launcher` |")
    assert [row[0].strip("`") for row in rows] == list(frameworks.LAUNCHERS), (
        "docs/multinode.md's launcher table must have one row per entry of contracts.frameworks.LAUNCHERS")
