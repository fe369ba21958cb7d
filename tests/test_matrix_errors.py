"""Every kind of bad matrix gives exit 2, one line with file:line and the key, and writes nothing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from buildtool.common.errors import MatrixError, UserError
from buildtool.matrix.loader import load_matrix
from tests.conftest import REPO, snapshot

# (id, text to replace in the real matrix.yaml, replacement, key expected in the message,
#  substring of the replacement on the line the message must point at, message fragment)
CASES = [
    ("unknown-top-level-key", "source: https://", "colour: blue\nsource: https://", "colour", "colour", "unknown key"),
    ("unknown-run-key", "    shm_size: 8g\n", "    shm_size: 8g\n    shm_sise: 1g\n", "defaults.run.shm_sise",
     "shm_sise", "unknown key"),
    ("unknown-version-key", '        framework_version: 2.9.0a0\n',
     '        framework_version: 2.9.0a0\n        frameworkversion: x\n', "images[0].versions[0].frameworkversion",
     "frameworkversion",
     "unknown key"),
    ("tests-not-a-list", "  tests: [common]\n", "  tests: common\n", "defaults.tests", "tests: common",
     "must be a list; write tests: [common]"),
    ("ulimit-not-int", "      stack: 67108864\n", "      stack: lots\n", "defaults.run.ulimits.stack", "stack",
     "must be a whole number (-1 for unlimited)"),
    ("version-unquoted", '      - version: "2.13"\n', "      - version: 2.13\n", "images[2].versions[0].version",
     "version: 2.13",
     "quote it"),
    ("version-unparsable", '      - version: "25.01"\n        base: nvcr.io/nvidia/pytorch',
     '      - version: "twenty-five"\n        base: nvcr.io/nvidia/pytorch', "images[0].versions[1].version",
     "twenty-five", "does not parse as a version"),
    ("duplicate-image", "  - name: pytorch-cuda\n", "  - name: pytorch-cpu\n", "images[3].name",
     "name: pytorch-cpu", "duplicate image 'pytorch-cpu'"),
    ("duplicate-version", '      - version: "25.01"\n        base: nvcr.io/nvidia/pytorch',
     '      - version: "25.10"\n        base: nvcr.io/nvidia/pytorch', "images[0].versions[1].version",
     'version: "25.10"', "duplicate version '25.10'"),
    ("duplicate-yaml-key", "    framework: pytorch\n    accelerator: cuda\n",
     "    framework: pytorch\n    accelerator: cuda\n    accelerator: cpu\n", "images[0].accelerator",
     "accelerator: cpu", "duplicate key"),
    ("missing-template", "template: images/ngc.Dockerfile.j2", "template: images/nope.Dockerfile.j2",
     "images[0].template", "nope.Dockerfile.j2", "template 'images/nope.Dockerfile.j2' not found"),
    ("bad-shm-size", "    shm_size: 8g\n", "    shm_size: 8 gigs\n", "defaults.run.shm_size", "8 gigs",
     "is not a size; write it like shm_size: 8g"),
    ("bad-ipc", "    ipc: private\n", "    ipc: shared\n", "defaults.run.ipc", "ipc: shared", "Input should be"),
    ("bad-gpus", "    gpus: all\n", "    gpus: two\n", "defaults.run.gpus", "gpus: two", "Input should be"),
    ("unknown-ulimit", "      stack: 67108864\n", "      stack: 67108864\n      stacks: 1\n",
     "defaults.run.ulimits.stacks", "stacks", "unknown key `stacks`; did you mean `stack`?"),
    ("unknown-test-group", "    tests: [common, pytorch]\n    use: Default",
     "    tests: [common, jax]\n    use: Default", "images[0].tests[1]", "tests: [common, jax]",
     "unknown test group 'jax'"),
    ("missing-use", "    use: PyTorch with PyPI's CUDA wheels", "    usage: PyTorch with PyPI's CUDA wheels",
     "images[3].usage", "usage:", "unknown key"),
    ("bad-image-name", "  - name: pytorch-cuda\n", "  - name: PyTorch_CUDA\n", "images[3].name", "PyTorch_CUDA",
     "not a valid image name"),
    ("unknown-framework", "    framework: tensorflow\n    accelerator: cpu\n",
     "    framework: jax\n    accelerator: cpu\n", "images[4].framework", "framework: jax", "unknown framework 'jax'"),
    ("two-defaults", '      - version: "25.01"\n        base: nvcr.io/nvidia/pytorch',
     '      - version: "25.01"\n        default: true\n        base: nvcr.io/nvidia/pytorch',
     "images[0].versions[1].default", "default: true", "a second version of pytorch-ngc with `default: true`"),
    ("wrong-schema", "schema: 1\n", "schema: 2\n", "schema", "schema: 2", "must be 1, the matrix format"),
    ("group-missing-framework", "    tests: [common, tensorflow]\n    use: TensorFlow on CPU",
     "    tests: [common]\n    use: TensorFlow on CPU", "images[4].tests", "tests: [common]",
     "must run the 'tensorflow' test group"),
    ("yaml-syntax", "  tests: [common]\n", "  tests: [common\n", "", None, "YAML syntax"),
    ("bool-as-string", "    gpus: all\n", "    gpus: yes\n", "defaults.run.gpus", "gpus: yes", "Input should be"),
    # The OCI labels of `oci:` (issue 25): an unknown key, a license SPDX does not know or spells otherwise,
    # a URL that is not a web page's.
    ("oci-unknown-key", "    vendor: dl-images\n", "    vendor: dl-images\n    vendr: x\n", "defaults.oci.vendr",
     "vendr", "unknown key `vendr`; did you mean `vendor`?"),
    ("oci-unknown-license", "      licenses: BSD-3-Clause\n", "      licenses: BSD-3-Clause AND Fancy-1.0\n",
     "images[2].oci.licenses", "Fancy-1.0", "is not an SPDX license expression (Unknown license: 'fancy-1.0')"),
    ("oci-malformed-license", "      licenses: BSD-3-Clause\n", "      licenses: BSD-3-Clause OR\n",
     "images[2].oci.licenses", "BSD-3-Clause OR", "is not an SPDX license expression"),
    ("oci-license-spelling", "      licenses: BSD-3-Clause\n", "      licenses: bsd-3-clause\n",
     "images[2].oci.licenses", "bsd-3-clause", "is not spelt as SPDX spells it; write 'BSD-3-Clause'"),
    ("oci-url-not-web", "    url: https://github.com/dl-images/dl-images\n",
     "    url: ftp://github.com/dl-images/dl-images\n", "defaults.oci.url", "ftp://",
     "a web page's URL must start with https:// or http://"),
    ("oci-authors-multiline", "    authors: dl-images maintainers (https://github.com/dl-images/dl-images/issues)"
                              "\n", "    authors: \"a\\nb\"\n",
     "defaults.oci.authors", "authors:", "contains a line break"),
    # Platforms (issue 24): only those the platform table knows, each once, and a multi-platform cell says
    # how much slower its emulated platform's tests run.
    ("unknown-platform", "  tests: [common]\n", "  tests: [common]\n  platforms: [linux/amd64, linux/arm46]\n",
     "defaults.platforms[1]", "linux/arm46", "unknown platform 'linux/arm46'; one of linux/amd64, linux/arm64; "
     "did you mean `linux/arm64`?"),
    ("duplicate-platform", "  tests: [common]\n", "  tests: [common]\n  platforms: [linux/amd64, linux/amd64]\n",
     "defaults.platforms[1]", "platforms:", "'linux/amd64' is listed twice; keep one"),
    ("empty-platforms", "  tests: [common]\n", "  tests: [common]\n  platforms: []\n",
     "defaults.platforms", "platforms: []", "is empty; list at least one entry"),
    ("multi-platform-without-emulation-factor", "  tests: [common]\n",
     "  tests: [common]\n  platforms: [linux/amd64, linux/arm64]\n", "defaults.platforms", "platforms:",
     "needs validate.emulation_factor"),
    ("emulation-factor-range", "    deadline_s: 480\n", "    deadline_s: 480\n    emulation_factor: 0\n",
     "defaults.validate.emulation_factor", "emulation_factor: 0", "must be between 1 and 20 (got 0)"),
]


def _mutate(text: str, old: str, new: str) -> tuple[str, int | None, str]:
    assert old in text, f"fixture text {old!r} no longer in matrix.yaml"
    return text.replace(old, new, 1), text.index(old), new


@pytest.mark.parametrize(("old", "new", "key", "marker", "fragment"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_matrix_is_one_line_exit_2_and_writes_nothing(project: Path, run_cli, old, new, key, marker, fragment):
    matrix = project / "matrix.yaml"
    mutated, start, new = _mutate(matrix.read_text(), old, new)
    matrix.write_text(mutated)
    # Make the outputs stale so a render that went ahead would visibly write.
    (project / "docs" / "images.md").write_text("stale\n")
    before = snapshot(project)

    code, out, err = run_cli("render", "--matrix", str(matrix))

    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    message = lines[0]
    assert re.match(r"^error: matrix\.yaml:\d+: ", message), message
    assert fragment in message
    if key:
        assert f": {key}" in message, message
    if marker is not None:
        expected_line = mutated.count("\n", 0, start) + 1 + new[: new.index(marker)].count("\n")
        assert message.startswith(f"error: matrix.yaml:{expected_line}: "), (expected_line, message)
    assert snapshot(project) == before


def test_at_least_twenty_kinds_of_bad_input():
    assert len(CASES) >= 20


def test_empty_matrix(project: Path, run_cli):
    (project / "matrix.yaml").write_text("")
    code, _, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    assert err.strip() == "error: matrix.yaml:1: the file is empty; declare `images:`"


def test_undefined_template_variable_names_template_line_and_cell(project: Path, run_cli):
    template = project / "templates" / "images" / "pip.Dockerfile.j2"
    text = template.read_text()
    template.write_text(text.replace("{% block framework %}\n", "{% block framework %}\n# {{ cell.gpu_arch }}\n"))
    before = snapshot(project)
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    pattern = r"^error: templates/images/pip\.Dockerfile\.j2:\d+: .*gpu_arch.* for cell pytorch-cpu:2\.13"
    assert re.match(pattern, err.strip()), err
    assert snapshot(project) == before


def test_missing_included_part(project: Path, run_cli):
    (project / "templates" / "parts" / "user.j2").unlink()
    before = snapshot(project)
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    assert "parts/user.j2" in err and len(err.strip().splitlines()) == 1
    assert snapshot(project) == before


@pytest.mark.parametrize("command", [["plan", "--framework", "jax-ngc"], ["plan", "--json", "-f", "pytorch-cpu:9.9"]])
def test_unknown_framework_on_command_line(project: Path, run_cli, command):
    code, out, err = run_cli(*command, "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    assert out == ""
    assert err.startswith("error: unknown FRAMEWORK=") and "pytorch-ngc" in err


# -- a test group is a folder: a cell that names one without it fails at load (issue 21) ---------------

@pytest.mark.parametrize(("group", "key", "marker", "message"), [
    # A framework is its folder: without it the framework is unknown, located at the first cell of it.
    ("tensorflow", "images[1].framework", "    framework: tensorflow\n",
     "unknown framework 'tensorflow'; one of pytorch (a new one is a folder image-tests/<name>/ with its "
     "framework.yaml)"),
    ("common", "defaults.tests[0]", "  tests: [common]\n",                      # named in defaults: located there
     "test group 'common' has no folder image-tests/common/; add the group's tests there, or remove it from tests"),
])
def test_a_test_group_without_its_folder_is_exit_2_at_load(project: Path, run_cli, group: str, key: str,
                                                            marker: str, message: str) -> None:
    shutil.rmtree(project / "image-tests" / group)
    text = (project / "matrix.yaml").read_text()
    line = text[: text.index(marker)].count("\n") + 1
    before = snapshot(project)
    for command in ("render", "check", "plan"):
        code, out, err = run_cli(command, "--matrix", str(project / "matrix.yaml"))
        assert code == 2 and out == "", (command, err)
        assert err.strip() == f"error: matrix.yaml:{line}: {key}: {message}", err
    assert snapshot(project) == before


def test_image_tests_are_looked_for_beside_the_matrix_unless_named(tmp_path: Path) -> None:
    """A matrix elsewhere (a fixture project) finds no groups beside it, and says where it looked;
    `tests_dir` names the folder for it."""
    matrix = tmp_path / "project" / "matrix.yaml"
    matrix.parent.mkdir()
    shutil.copy2(REPO / "matrix.yaml", matrix)
    with pytest.raises(UserError) as caught:
        load_matrix(matrix, REPO / "templates")
    assert str(caught.value) == (f"{matrix}: no folder image-tests/ for its image tests: every framework is a "
                                 "folder there (framework.yaml, its tests, its scripts), and so is every test group")
    cells = load_matrix(matrix, REPO / "templates", tests_dir=REPO / "image-tests").cells
    assert {c.key: c.tests for c in cells}["pytorch-cpu:2.13"] == ("common", "pytorch")
    elsewhere = tmp_path / "suite"
    (elsewhere / "common").mkdir(parents=True)
    with pytest.raises(MatrixError) as caught:
        load_matrix(matrix, REPO / "templates", tests_dir=elsewhere)
    assert ": images[0].framework: unknown framework 'pytorch'; one of (none) (a new one is a folder" \
        in str(caught.value)


@pytest.mark.parametrize(("first", "message"), [
    ("{#- needs: framework_requirments -#}",
     "'framework_requirments' is not a cell field; did you mean `framework_requirements`?"),
    ("{#- needs: framework-requirements (installs the framework with pip) -#}",
     "'framework-requirements' is not a cell field; did you mean `framework_requirements`?"),
    ("{# needs: #}", "lists no field (or an empty one between commas)"),
])
def test_unknown_name_on_a_templates_needs_line(project: Path, run_cli, first: str, message: str):
    """A misspelt name on a template's `needs:` line would drop the check it asks for: it is an error at
    the template's first line."""
    template = project / "templates" / "images" / "pip.Dockerfile.j2"
    lines = template.read_text().split("\n", 1)
    assert lines[0].startswith("{#- needs: framework_requirements")
    template.write_text(first + "\n" + lines[1])
    before = snapshot(project)
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: templates/images/pip.Dockerfile.j2:1: needs: {message}"), err
    assert snapshot(project) == before


def test_every_committed_templates_needs_line_names_cell_fields():
    from buildtool.matrix.cells import _template_needs

    templates = REPO / "templates"
    needs = {str(p.relative_to(templates)): _template_needs(templates, str(p.relative_to(templates)))
             for p in templates.rglob("*.j2")}
    assert needs["images/pip.Dockerfile.j2"] == ("framework_requirements",)


def test_an_image_named_like_a_dev_repository_is_refused_at_its_name(project: Path, run_cli) -> None:
    """`pytorch-cpu-dev` would release into the dev repository of pytorch-cpu, and launch, validate and bundle
    (contracts.names.image_of_repo_path) read its images as dev images of pytorch-cpu: refused at load."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    marker = "  - name: pytorch-cpu\n"
    matrix.write_text(text.replace(marker, "  - name: pytorch-cpu-dev\n", 1))
    line = text[: text.index(marker)].count("\n") + 1
    index = text[: text.index(marker)].count("  - name: ")
    before = snapshot(project)
    code, out, err = run_cli("plan", "--matrix", str(matrix))
    assert code == 2 and out == "", err
    assert err.strip().startswith(f"error: matrix.yaml:{line}: images[{index}].name: 'pytorch-cpu-dev' ends in '-dev': "
                                  "pytorch-cpu-dev is the repository of the dev images of pytorch-cpu"), err
    assert snapshot(project) == before


_ANOTHER_VERSION = ('        release:\n          moving: ["{version}", latest]\n\n',
                    '        release:\n          moving: ["{version}", latest]\n      - version: "VERSION"\n'
                    '        framework_version: 2.13.0+cpu\n        framework_requirements: ["torch==2.13.0+cpu"]\n\n')


def test_a_moving_tag_that_a_release_of_another_version_makes_is_refused(project: Path, run_cli) -> None:
    """Version 2.13-1 (PEP 440: 2.13.post1) takes the moving tag `{version}` = 2.13-1 from defaults, which is the
    immutable tag of release 1 of 2.13 (`{version}-{release}`): releasing 2.13-1 would move it. Refused at the
    moving template, naming the other cell, its template and its line."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    old, new = _ANOTHER_VERSION
    assert text.count(old) >= 1 and "  - name: pytorch-cpu\n" in text
    start = text.index(old, text.index("  - name: pytorch-cpu\n"))
    matrix.write_text(text[:start] + new.replace("VERSION", "2.13-1") + text[start + len(old):])
    moving_line = text[: text.index('    moving: ["{version}"]')].count("\n") + 1
    tags_line = text[: text.index('    tags: ["{version}-{release}"]')].count("\n") + 1
    before = snapshot(project)
    code, out, err = run_cli("plan", "--matrix", str(matrix))
    assert code == 2 and out == "", err
    assert err.strip() == (
        f"error: matrix.yaml:{moving_line}: defaults.release.moving[0]: moving tag template '{{version}}' gives "
        f"'2.13-1', which is also the immutable tag of release 1 of pytorch-cpu:2.13 ('{{version}}-{{release}}', "
        f"line {tags_line}): releasing pytorch-cpu:2.13-1 would move it; change the version or one of the two "
        "templates"), err
    assert snapshot(project) == before


@pytest.mark.parametrize("version", ["2.13.1", "2.13-dev", "2.13-rc1", "3.0"])
def test_a_version_whose_moving_tag_no_release_makes_loads(project: Path, run_cli, version: str) -> None:
    """`2.13-dev` and `2.13-rc1` are no tag a release of 2.13 makes (a release is a normal-form version: digits
    first)."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    old, new = _ANOTHER_VERSION
    start = text.index(old, text.index("  - name: pytorch-cpu\n"))
    matrix.write_text(text[:start] + new.replace("VERSION", version) + text[start + len(old):])
    code, out, err = run_cli("plan", "--json", "--matrix", str(matrix))
    assert code == 0, err
    assert f"pytorch-cpu:{version}" in out


@pytest.mark.parametrize(("first", "second"), [("2.13", "2.13.0"), ("2.13rc1", "2.13RC1")])
def test_one_version_spelt_two_ways_is_one_line_naming_both(tmp_path: Path, first: str, second: str) -> None:
    """2.13 and 2.13.0 (or 2.13rc1 and 2.13RC1) are one PEP 440 version: release refuses a second spelling of a
    release, and the case variants share a Dockerfile folder on a case-insensitive filesystem."""
    matrix = tmp_path / "project" / "matrix.yaml"
    matrix.parent.mkdir()
    text = (REPO / "matrix.yaml").read_text()
    start = text.index("  - name: pytorch-cpu\n")
    old, new = _ANOTHER_VERSION
    at = text.index(old, start)
    text = (text[:start] + text[start:at].replace('- version: "2.13"\n', f'- version: "{first}"\n', 1)
            + new.replace("VERSION", second) + text[at + len(old):])
    matrix.write_text(text)
    lines = text.splitlines()
    first_line = lines.index(f'      - version: "{first}"') + 1
    second_line = lines.index(f'      - version: "{second}"') + 1
    with pytest.raises(MatrixError) as caught:
        load_matrix(matrix, REPO / "templates", display="matrix.yaml", tests_dir=REPO / "image-tests")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"matrix.yaml:{second_line}: images[3].versions[1].version: "), message
    assert f"version '{second}' of pytorch-cpu is version '{first}' (line {first_line}) spelt otherwise" in message


def test_the_committed_matrix_has_one_spelling_of_each_version() -> None:
    cells = load_matrix(REPO / "matrix.yaml", REPO / "templates", tests_dir=REPO / "image-tests").cells
    assert "pytorch-cpu:2.13" in {c.key for c in cells}


def test_a_package_spelt_otherwise_in_a_later_layer_is_refused_not_pinned_twice(project: Path, run_cli) -> None:
    """defaults pin `tensorboard`; an image that writes `TensorBoard: ...` (the same distribution: names compare
    without case, '-', '_' or '.') meant to change that pin, and got both pins in its cells. Refused at the later
    spelling, naming the first and its line."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    marker = '      torch-tb-profiler: "0.4.3"\n'
    assert marker in text
    matrix.write_text(text.replace(marker, marker + '      TensorBoard: "2.20.0"\n', 1))
    line = text[: text.index(marker)].count("\n") + 2
    first = text[: text.index('    tensorboard: "2.21.0"')].count("\n") + 1
    before = snapshot(project)
    code, out, err = run_cli("plan", "--matrix", str(matrix))
    assert code == 2 and out == "", err
    assert err.strip().startswith(f"error: matrix.yaml:{line}: images[0].packages.TensorBoard: 'TensorBoard' is the "
                                  f"same package as 'tensorboard' (line {first};"), err
    assert "write 'tensorboard' to change its pin" in err
    assert snapshot(project) == before


@pytest.mark.parametrize(("name", "fragment"), [
    ("tensorflow", "'tensorflow' is the name of the framework tensorflow (image-tests/tensorflow/), and "
                   "FRAMEWORK=tensorflow selects every image of that framework"),
    ("all", "'all' is what FRAMEWORK=all means (every image)"),
])
def test_an_image_named_like_a_framework_or_all_is_refused_at_its_name(project: Path, run_cli, name: str,
                                                                        fragment: str) -> None:
    """An image (of pytorch) named `tensorflow`: FRAMEWORK=tensorflow selected it with every tensorflow image (and
    the release workflow's `tensorflow` released them all); one named `all` could never be selected alone."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    marker = "  - name: pytorch-cpu\n"
    matrix.write_text(text.replace(marker, f"  - name: {name}\n", 1))
    line = text[: text.index(marker)].count("\n") + 1
    index = text[: text.index(marker)].count("  - name: ")
    before = snapshot(project)
    code, out, err = run_cli("plan", "--matrix", str(matrix))
    assert code == 2 and out == "", err
    assert err.strip().startswith(f"error: matrix.yaml:{line}: images[{index}].name: {fragment}"), err
    assert snapshot(project) == before


def test_a_key_with_control_or_format_characters_is_shown_escaped(tmp_path: Path) -> None:
    """A key written with YAML escapes ("\\e[2K", "\\u2028", "\\u202e") reached the error verbatim: an ANSI sequence
    that erased or recoloured the terminal's line, a line break, a reversed key in what must be one plain line."""
    matrix = tmp_path / "matrix.yaml"
    text = (REPO / "matrix.yaml").read_text()
    matrix.write_text(text.replace("schema: 1\n", 'schema: 1\n"a\\e[2K\\u2028\\u202eb": 1\n', 1))
    line = text[: text.index("schema: 1\n")].count("\n") + 2
    with pytest.raises(MatrixError) as caught:
        load_matrix(matrix, REPO / "templates", display="matrix.yaml", tests_dir=REPO / "image-tests")
    shown = "a\\x1b[2K\\u2028\\u202eb"
    assert str(caught.value) == (f"matrix.yaml:{line}: {shown}: unknown key `{shown}`; remove it or check its "
                                 "spelling")
