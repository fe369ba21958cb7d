"""The line-keeping YAML loader: libyaml's events, or PyYAML's pure-Python parser where
libyaml is missing, give the same document, the same lines and the same refusals."""

from __future__ import annotations

import pytest
import yaml

from buildtool.common.errors import MatrixError
from buildtool.matrix import yamlsource
from tests.conftest import FIXTURE_MATRIX

MATRIX = FIXTURE_MATRIX.read_text()
LOADERS = [pytest.param(yaml.SafeLoader, id="pure-python")]
if yamlsource.LIBYAML:
    LOADERS.append(pytest.param(yaml.CSafeLoader, id="libyaml"))


@pytest.fixture(params=LOADERS)
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.setattr(yamlsource, "_Loader", request.param)
    return request.param


def test_libyaml_is_what_runs_here():
    """The speed target needs libyaml; the project's PyYAML wheel ships it."""
    assert yamlsource.LIBYAML and yamlsource._Loader is yaml.CSafeLoader


def test_same_data_as_pyyaml(loader: type):
    doc = yamlsource.parse_yaml(MATRIX, "matrix.yaml")
    assert doc.data == yaml.safe_load(MATRIX)


def test_lines_of_keys_values_and_items(loader: type):
    doc = yamlsource.parse_yaml(MATRIX, "matrix.yaml")
    lines = MATRIX.split("\n")

    def line(loc: tuple) -> str:
        return lines[doc.line_of(loc) - 1]

    assert line(("schema",)) == "schema: 1"
    assert line(("defaults", "run", "shm_size")).strip() == "shm_size: 8g"
    assert line(("images", 2, "name")).strip() == "- name: pytorch-cpu"
    assert line(("images", 2, "versions", 0, "framework_requirements", 0)).strip().startswith(
        "framework_requirements:")
    assert line(("images", 0, "versions")).strip() == "versions:"
    # Past the document (pydantic locations can be): the deepest known part.
    assert line(("images", 0, "versions", 0, "nope", 3)).strip() == '- version: "25.10"'


def test_a_value_on_its_own_line_is_located_there(loader: type):
    doc = yamlsource.parse_yaml("a:\n  b:\n    long value\n", "m.yaml")
    assert doc.line_of(("a", "b")) == 3 and doc.line_of(("a",)) == 1


def test_anchors_aliases_and_merge_keys(loader: type):
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: [*b]\n"
    doc = yamlsource.parse_yaml(text, "m.yaml")
    assert doc.data == {"base": {"x": 1, "y": 2}, "other": {"x": 1, "y": 3}, "list": [{"x": 1, "y": 2}]}
    assert doc.line_of(("other", "x")) == 3 and doc.line_of(("other", "y")) == 4


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ("a: 1\na: 2\n", 2, "duplicate key (already set on line 1)"),
    ("a: [" + "[" * 40 + "]" * 41 + "\n", 1, "nested more than 32 levels deep"),
    ("a: &a [*a]\n", 1, "alias *a refers to a value that contains it"),
    ("a: *nope\n", 1, "alias *nope has no anchor"),
    ("a: !!python/name:os.system x\n", 1, "YAML tag"),
    ("a: 1\n---\nb: 2\n", 2, "a second YAML document"),
    ("? [a, b]\n: c\n", 1, "keys must be plain strings"),
    ("a: 0x1G\nb: !!int x\n", 2, "cannot be read as int"),
    ("a: 'it's'\n", 1, "text follows a closing quote"),
])
def test_refusals_are_located(loader: type, text: str, line: int, fragment: str):
    with pytest.raises(MatrixError) as caught:
        yamlsource.parse_yaml(text, "m.yaml")
    assert caught.value.line == line and fragment in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["a: {<<: 1}\n", "x: 1\na:\n  b: 2\n  <<: text\n", "a: {b: 2, <<: null}\n",
                                  "a: {<<: [1]}\n"])
def test_a_merge_key_with_a_plain_value_is_refused(loader: type, text: str):
    """`<<` takes a mapping (or a list of them), as in PyYAML: a scalar is never stored as a key `<<`."""
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(text)
    with pytest.raises(MatrixError, match="`<<` merges a mapping") as caught:
        yamlsource.parse_yaml(text, "m.yaml")
    assert caught.value.line == text.count("\n", 0, text.index("<<")) + 1


@pytest.mark.parametrize("text", ["base: &b {x: 1}\nm:\n  '<<': *b\n  y: 2\n", 'm: {"<<": 1}\n',
                                  "b: &b {x: 1}\nm:\n  <<: *b\n  '<<': 3\n", "m: {'<<': {x: 1}, x: 2}\n"])
def test_a_quoted_merge_key_is_a_key_as_in_pyyaml(loader: type, text: str):
    """Only a plain `<<` is YAML's merge key; a quoted '<<' is the text, a key like any other (PyYAML keeps it so).
    It was merged (or refused as a merge of a scalar); the matrix's schema now names it as an unknown key."""
    assert yamlsource.parse_yaml(text, "m.yaml").data == yaml.safe_load(text)


@pytest.mark.parametrize(("text", "line", "written"), [("~", 1, "~"), ("null\n", 1, "null"),
                                                     ("# nothing yet\n--- Null\n", 2, "Null")])
def test_a_null_document_is_not_called_an_empty_file(loader: type, text: str, line: int, written: str):
    with pytest.raises(MatrixError) as caught:
        yamlsource.parse_yaml(text, "m.yaml")
    assert str(caught.value) == f"m.yaml:{line}: the document is null (`{written}`), not a mapping; declare `images:`"
    for empty in ("", "# nothing yet\n", "---\n"):
        with pytest.raises(MatrixError, match="^m.yaml:1: the file is empty; declare `images:`$"):
            yamlsource.parse_yaml(empty, "m.yaml")


def test_alias_expansion_is_bounded(loader: type):
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    with pytest.raises(MatrixError, match="aliases expand to more than"):
        yamlsource.parse_yaml("\n".join(lines) + "\n", "m.yaml")
    # Well under the bound, aliases are ordinary YAML.
    small = "a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"
    assert yamlsource.parse_yaml(small, "m.yaml").data["b"] == [[1, 2, 3]] * 3


@pytest.mark.parametrize(("text", "data"), [
    ("a: &x 1\nb: &x 2\nc: *x\n", {"a": 1, "b": 2, "c": 2}),
    ("a: &a [&a 1, *a]\n", {"a": [1, 1]}),
    ("a: &a [&a [1], *a]\nb: *a\n", {"a": [[1], [1]], "b": [1]}),    # the inner &a is the later one
    ("a: &a [&a 1]\nb: *a\n", {"a": [1], "b": 1}),
    ("a: &a {b: &a x, c: *a}\n", {"a": {"b": "x", "c": "x"}}),
])
def test_an_alias_is_the_most_recent_node_of_its_anchor(loader: type, text: str, data: dict):
    """YAML 1.2 (3.2.2.2): an anchor may be defined again, and an alias refers to the most recent preceding node of
    its anchor. `&a [&a 1, *a]` was refused as an alias inside the value it refers to (the outer list), though *a
    is the inner `&a 1`; and once the outer closed, *a named it again, not the inner and later `&a` (ruamel.yaml
    reads both so). A re-defined anchor stays allowed (PyYAML's composer alone refuses it)."""
    assert yamlsource.parse_yaml(text, "m.yaml").data == data


@pytest.mark.parametrize("text", ["a: &a [&a [*a]]\n", "x: &a 1\na: &a [*a]\n", "a: &a [&a 1, &a [*a]]\n"])
def test_an_alias_inside_the_most_recent_node_of_its_anchor_is_refused(loader: type, text: str):
    with pytest.raises(MatrixError, match=r"alias \*a refers to a value that contains it"):
        yamlsource.parse_yaml(text, "m.yaml")


def test_a_matrix_that_grew_past_the_bound_after_its_size_was_read_is_refused(tmp_path, monkeypatch):
    """_read took the size from stat, then read up to MAX_BYTES + 1 bytes and never looked at how many came: a
    file that grew past the bound in between (still being written) was parsed cut at MAX_BYTES + 1 bytes, possibly
    as valid YAML missing its end; now that is the size refusal."""
    monkeypatch.setattr(yamlsource, "MAX_BYTES", 1 << 20)
    path = tmp_path / "matrix.yaml"
    path.write_text("images: []\n")
    small = path.stat()
    path.write_text("images: []\n" + "# grown\n" * (1 << 17))

    class Stale(type(path)):
        def stat(self, **_: object):
            return small

    with pytest.raises(MatrixError) as caught:
        yamlsource.load_yaml(Stale(path), "matrix.yaml")
    assert str(caught.value) == ("matrix.yaml: grew past the 1 MiB a matrix may have while it was read (is it still "
                                 "being written?); split it or remove generated content")


@pytest.mark.parametrize(("text", "line"), [("!!python/name:os.system x: 1\n", 1), ("a:\n  !!int 1: x\n", 2),
                                            ("a: {!!binary aGk=: 1}\n", 1)])
def test_a_tagged_key_is_refused_as_a_tagged_value_is(loader: type, text: str, line: int):
    """A key's YAML tag was dropped without a word (`!!python/name:os.system x` read as the key 'x', `!!int 1` as
    '1'), where a value's is refused; now a key's is refused too, at its line (`!!str` is a string's own tag)."""
    with pytest.raises(MatrixError) as caught:
        yamlsource.parse_yaml(text, "m.yaml")
    assert caught.value.line == line and "keys must be plain strings (no tags" in str(caught.value)
    assert yamlsource.parse_yaml("a:\n  !!str b: 1\n", "m.yaml").data == {"a": {"b": 1}}
