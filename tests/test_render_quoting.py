"""Defence in depth: even a value that got past the schema is one inert word in a Dockerfile.

The cells here are built directly (dataclasses.replace on real cells), so the schema never
sees them. Every template renders them; every RUN line that holds a matrix value must pass
`bash -n`, parse (bashlex) to the same shape as with harmless values, and hold each hostile
value as exactly one word; every LABEL value must read back, by BuildKit's quoting rules, as
exactly the matrix value; no line break from a cell reaches a Dockerfile at all. The same
checks run against a copy of the templates without the quoting filters and must fail there:
that is what proves they can. Requirements and index URLs no longer reach RUN lines (they go
into the cell's locks, build/lock.py); the requirements file uv reads is checked here too.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import bashlex
import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.imagebuild import lock
from buildtool.imagebuild.bases import _standin_dockerfile
from buildtool.matrix.schema import Cell, Matrix, StandIn
from buildtool.render.dockerfiles import TemplateError, _environment, label_value, render_dockerfile, sh_word
from tests.conftest import REPO, fixture_matrix

TEMPLATES = REPO / "templates"
MATRIX = fixture_matrix()
IMAGE_TEMPLATES = sorted(str(p.relative_to(TEMPLATES)) for p in (TEMPLATES / "images").glob("*.j2"))

# Each one would run a command, split a word, glob, redirect or comment out the rest if it
# reached a shell unquoted (a canary path, never executed here: the tests only parse).
HOSTILE = [
    '2.21.0" && touch /tmp/canary && echo "',
    "$(touch /tmp/canary)",
    "`touch /tmp/canary`",
    "x; touch /tmp/canary",
    "x && touch /tmp/canary",
    "https://pypi.example.org/simple && touch /tmp/canary",
    "it's",
    "two words",
    "glob*",
    "$HOME",
    "${IFS}x",
    "~root",
    "a|b",
    "a>/tmp/canary",
    "#rest",
    "back\\slash\\",
    "<(touch /tmp/canary)",
]


def _hostile_cell(template: str, values: list[str], label_text: str) -> tuple[Cell, list[str]]:
    """A cell whose every shell-bound value is hostile; returns it and the words each must become."""
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    packages = tuple((f"pkg{i}{v}", v) for i, v in enumerate(values[:4]))
    cell = dataclasses.replace(
        base,
        template=template,
        framework_requirements=tuple(values),
        packages=packages,
        apt_packages=tuple(values),
        index_url=values[0],
        extra_index_urls=tuple(values[1:3]),
        use=label_text,
        framework_version=label_text,
        python=label_text,
    )
    words = [*values, *(f"{n}=={v}" for n, v in packages)]
    return cell, words


def _instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile instructions (continuations joined, comment lines dropped) as (KEYWORD, rest)."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def _run_command(rest: str) -> str:
    """The shell command of a RUN instruction (its --mount/--network flags are Dockerfile syntax)."""
    return re.sub(r"^(?:--[a-z-]+=\S+\s+)*", "", rest)


def _shape(node: Any) -> list[str]:
    """Everything about a parsed command except the text of its words."""
    kind = node.kind
    out = [kind if kind != "operator" else f"operator {node.op}"]
    if kind == "pipe":
        out[-1] = f"pipe {node.pipe}"
    for child in getattr(node, "parts", []) or []:
        out += _shape(child)
    if getattr(node, "command", None) is not None:
        out += ["("] + _shape(node.command) + [")"]
    return out


def _run_problems(benign: str, hostile: str, expected_words: list[str]) -> list[str]:
    """Why the hostile Dockerfile's RUN lines are not the benign ones with inert words swapped in."""
    problems: list[str] = []
    runs = [(_run_command(r)) for k, r in _instructions(hostile) if k == "RUN"]
    safe_runs = [(_run_command(r)) for k, r in _instructions(benign) if k == "RUN"]
    if len(runs) != len(safe_runs):
        return [f"{len(runs)} RUN instructions instead of {len(safe_runs)}"]
    seen_words: set[str] = set()
    for command, safe in zip(runs, safe_runs, strict=True):
        if command == safe:
            continue  # no matrix value on this line (bashlex cannot parse every line bash can)
        syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True, timeout=30)
        if syntax.returncode != 0:
            problems.append(f"bash -n: {syntax.stderr.strip()} in {command!r}")
            continue
        try:
            parsed = bashlex.parse(command)
        except Exception as exc:  # noqa: BLE001 - bashlex's own errors are what we report
            problems.append(f"bashlex cannot parse {command!r}: {exc}")
            continue
        shape = [item for node in parsed for item in _shape(node)]
        safe_shape = [item for node in bashlex.parse(safe) for item in _shape(node)]
        if shape != safe_shape:
            problems.append(f"the command's structure changed: {command!r}")
        # bashlex proves the structure; POSIX quote removal (shlex) gives each word's value.
        try:
            seen_words |= set(shlex.split(command))
        except ValueError as exc:
            problems.append(f"shlex cannot split {command!r}: {exc}")
    for word in expected_words:
        if word not in seen_words:
            problems.append(f"{word!r} is not one word on any RUN line")
    return problems


def _unquote_dockerfile_word(text: str) -> tuple[str, int, list[str]]:
    """Read one word the way BuildKit's shell lexer does; (value, characters used, problems)."""
    value, problems, i = "", [], 0
    while i < len(text) and not text[i].isspace():
        char = text[i]
        if char == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '"$\\':
                    value += text[i + 1]
                    i += 2
                    continue
                if text[i] == "$":
                    problems.append(f"unescaped $ would substitute a build variable: {text!r}")
                value += text[i]
                i += 1
            if i >= len(text):
                problems.append(f"unterminated double quote in {text!r}")
            i += 1
        elif char == "\\" and i + 1 < len(text):
            value += text[i + 1]
            i += 2
        else:
            if char == "$":
                problems.append(f"unescaped $ would substitute a build variable: {text!r}")
            value += char
            i += 1
    return value, i, problems


def _labels(dockerfile: str) -> tuple[dict[str, str], list[str]]:
    labels: dict[str, str] = {}
    problems: list[str] = []
    for keyword, rest in _instructions(dockerfile):
        if keyword != "LABEL":
            continue
        text = rest
        while text.strip():
            text = text.lstrip()
            key, sep, after = text.partition("=")
            if not sep or any(c.isspace() for c in key):
                problems.append(f"not key=value at {text[:40]!r}")
                break
            value, used, found = _unquote_dockerfile_word(after)
            problems += found
            labels[key] = value
            text = after[used:]
    return labels, problems


def _render(templates: Path, cell: Cell) -> str:
    matrix = Matrix(path="matrix.yaml", source=MATRIX.source, cells=(cell,))
    return render_dockerfile(_environment(templates), templates, matrix, cell)


def _unquoted_templates(tmp_path: Path, style: str) -> Path:
    """A copy of templates/ without the quoting filters: values `bare`, or in `double` quotes
    (how the templates quoted requirements before); LABEL values in plain double quotes."""
    copy = tmp_path / f"templates-{style}"
    shutil.copytree(TEMPLATES, copy)
    for path in copy.rglob("*.j2"):
        text = path.read_text()
        text = text.replace('| map("sh") ', "")
        text = re.sub(r"\{\{ (\S+) \| sh \}\}", r'"{{ \1 }}"' if style == "double" else r"{{ \1 }}", text)
        text = re.sub(r"=\{\{ \(?(.*?)\)? \| label \}\}", r'="{{ \1 }}"', text)
        path.write_text(text)
    assert "| sh" not in "".join(p.read_text() for p in copy.rglob("*.j2"))
    return copy


def _used_words(template: str, templates: Path, values: list[str]) -> tuple[str, list[str]]:
    """The benign rendering, and which of the hostile cell's words this template puts on RUN lines."""
    benign, benign_words = _hostile_cell(template, [f"benign{i}" for i in range(len(values))], "plain")
    text = _render(templates, benign)
    on_run_lines = {w for k, r in _instructions(text) if k == "RUN" for w in shlex.split(_run_command(r))}
    _, words = _hostile_cell(template, values, LABEL_TEXT)
    return text, [w for w, b in zip(words, benign_words, strict=True) if b in on_run_lines]


LABEL_TEXT = 'say "hi" to $HOME and `id`, back\\slash\\'


# Templates that put a matrix value on a RUN line (the others hold them only in LABELs and comments).
SHELL_TEMPLATES = [t for t in IMAGE_TEMPLATES if _used_words(t, TEMPLATES, HOSTILE)[1]]


def test_no_template_puts_matrix_values_on_run_lines():
    """Matrix values reach RUN lines no more: apt packages go through apt.lock (below), pip ones through the
    pip locks (so the RUN-line negative control over templates without `| sh` has nothing left to catch). A
    template that starts doing it again must quote them, and this fails to bring that control back."""
    assert SHELL_TEMPLATES == []


@pytest.mark.parametrize("template", IMAGE_TEMPLATES)
def test_every_template_keeps_hostile_values_one_inert_word(template: str):
    hostile, _ = _hostile_cell(template, HOSTILE, LABEL_TEXT)
    benign_text, used = _used_words(template, TEMPLATES, HOSTILE)
    hostile_text = _render(TEMPLATES, hostile)
    assert _run_problems(benign_text, hostile_text, used) == []
    labels, problems = _labels(hostile_text)
    assert problems == []
    for key in (label_keys.OCI_DESCRIPTION, label_keys.FRAMEWORK_VERSION, label_keys.PYTHON):
        assert labels[key] == LABEL_TEXT, key


@pytest.mark.parametrize("template", IMAGE_TEMPLATES)
def test_the_label_checks_catch_templates_without_label(template: str, tmp_path: Path):
    """The negative control for LABELs: plain double quotes (the templates before) misread them."""
    unquoted = _unquoted_templates(tmp_path, "double")
    hostile, _ = _hostile_cell(template, HOSTILE, LABEL_TEXT)
    labels, label_problems = _labels(_render(unquoted, hostile))
    assert label_problems or labels.get(label_keys.OCI_DESCRIPTION) != LABEL_TEXT


@pytest.mark.parametrize("value", HOSTILE)
def test_each_hostile_value_is_refused_on_its_way_to_the_apt_step(value: str):
    """The apt step's words come from the matrix's apt_packages (refused by their grammar at load) and from
    apt.lock (refused by its parser): neither lets a hostile value through to the RUN line."""
    from buildtool.contracts.apt_lock_format import parse_apt_lock
    from buildtool.matrix import values

    with pytest.raises(ValueError, match="is not a Debian package name"):
        values.apt_package(value)
    lock = (REPO / "tests/fixtures/project/dockerfiles/pytorch/pytorch-cpu/2.13/apt.lock").read_text()
    with pytest.raises(ValueError, match="is not `name=version`"):
        parse_apt_lock(lock + f"openssl={value}\n")


@pytest.mark.parametrize("field", ["use", "python", "framework_version", "base", "version", "name",
                                   "apt_packages", "packages", "accelerator", "tests"])
@pytest.mark.parametrize("brk", ["\n", "\r", "\x00", "\u2028"])
def test_a_line_break_never_reaches_a_dockerfile(field: str, brk: str):
    """A line break would end the instruction and start one of the matrix's choosing."""
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    evil = f"x{brk}RUN touch /tmp/canary"
    value: Any = evil
    if field in ("apt_packages", "tests"):
        value = (evil,)
    elif field == "packages":
        value = (("pkg", evil),)
    cell = dataclasses.replace(base, **{field: value})
    with pytest.raises(TemplateError, match="line break or control character") as caught:
        _render(TEMPLATES, cell)
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x85"])
def test_a_line_break_in_a_framework_row_never_reaches_a_dockerfile(brk: str, monkeypatch: pytest.MonkeyPatch):
    """framework.yaml's title (its pattern keeps out \\x00-\\x1f and \\x7f only) went unchecked into a comment line of
    each Dockerfile of the framework, and the render's line tidying split it at U+2028, U+2029 or \\x85: the rest
    became an instruction (RUN touch /tmp/canary). It is refused in one line naming the framework.yaml."""
    from buildtool.contracts import frameworks

    evil = dataclasses.replace(frameworks.get("pytorch"), title=f"PyTorch{brk}RUN touch /tmp/canary #")
    monkeypatch.setitem(frameworks._table(), "pytorch", evil)
    cells = [c for c in MATRIX.cells if c.framework == "pytorch"]
    assert {c.template for c in cells} >= {"images/pip.Dockerfile.j2", "images/ngc.Dockerfile.j2"}
    for cell in cells:
        with pytest.raises(TemplateError, match="line break or control character") as caught:
            _render(TEMPLATES, cell)
        message = str(caught.value)
        assert "\n" not in message and "framework.yaml" in message and "matrix.yaml" not in message, message


def test_filters_themselves():
    assert sh_word("$(id)") == "'$(id)'"
    assert sh_word("torch==2.13.0+cpu") == "torch==2.13.0+cpu"
    assert label_value('a"b$c\\d') == '"a\\"b\\$c\\\\d"'
    for bad in ("a\nb", "a\rb"):
        with pytest.raises(TemplateError):
            sh_word(bad)
        with pytest.raises(TemplateError):
            label_value(bad)


def test_standin_dockerfile_quotes_its_requirements():
    """The NGC stand-in's Dockerfile (build/bases.py) puts matrix requirements on a RUN line too."""
    cell = next(c for c in MATRIX.cells if c.standin is not None)
    hostile = dataclasses.replace(cell, standin=StandIn.model_construct(
        base="docker.io/library/debian:bookworm-slim", requirements=list(HOSTILE), workdir="/workspace"))
    benign = dataclasses.replace(cell, standin=StandIn.model_construct(
        base="docker.io/library/debian:bookworm-slim", requirements=[f"ok{i}" for i in range(len(HOSTILE))],
        workdir="/workspace"))
    ref = "127.0.0.1:5000/library/debian:bookworm-slim"
    assert _run_problems(_standin_dockerfile(benign, ref), _standin_dockerfile(hostile, ref), HOSTILE) == []


@pytest.mark.parametrize("value", ["torch==2.13.0\n--index-url http://evil.example/simple", "--extra-index-url=x",
                                   " -r /etc/passwd", "", "torch==2.13.0\r-e .", "a\x00b"])
def test_a_requirement_never_adds_lines_or_options_to_the_lock_input(value: str, monkeypatch: pytest.MonkeyPatch):
    """`make lock` writes the cell's requirements into a file uv reads; one value is one line."""
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    cell = dataclasses.replace(base, framework_requirements=(value,))
    ran: list[list[str]] = []
    monkeypatch.setattr(lock, "_run_uv", lambda argv, env, cwd: ran.append(argv))
    with pytest.raises(UserError, match="is not one PEP 508 requirement"):
        lock.compile_cell(cell, lock.HostPip(), lock.Pins(), base=None, log=print,
                          reachable=lambda url: True)
    assert ran == []
    assert lock.requirement_lines(["torch==2.13.0", "tensorboard==2.21.0"]) == "torch==2.13.0\ntensorboard==2.21.0\n"


def _python_version_words(dockerfile: str) -> list[tuple[str, list[str], str]]:
    """(the value after --python-version as bash reads it, the expansions in that word, bash -n's complaint) for
    each uv install line of the Dockerfile (just that command: bashlex cannot parse the `case` around it)."""
    found = []
    for keyword, rest in _instructions(dockerfile):
        command = _run_command(rest)
        if keyword != "RUN" or "--python-version" not in command:
            continue
        install = command[command.index("/run/uv/uv pip install"):]
        install = install[:install.index(" -r /run/")]
        syntax = subprocess.run(["bash", "-n", "-c", install], capture_output=True, text=True, timeout=30)
        try:
            words = bashlex.parse(install)[0].parts
        except Exception as exc:  # noqa: BLE001 - bashlex's own errors are what we report
            found.append(("", [], f"bashlex: {exc}"))
            continue
        at = next(i for i, w in enumerate(words) if getattr(w, "word", "") == "--python-version") + 1
        word = words[at] if at < len(words) and words[at].kind == "word" else None
        # bashlex finds the expansions in the word; POSIX quote removal (shlex) gives its value.
        found.append(("" if word is None else " ".join(shlex.split(install[word.pos[0]:word.pos[1]])),
                      [part.kind for part in (word.parts or [])] if word is not None else ["not a word"]
                      + [w.kind for w in words[at + 1:] if w.kind != "word"],
                      syntax.stderr.strip()))
    return found


@pytest.mark.parametrize("template", IMAGE_TEMPLATES)
@pytest.mark.parametrize("value", HOSTILE)
def test_a_multi_platform_cells_python_is_one_inert_word_on_its_run_lines(template: str, value: str):
    """A multi-platform cell installs its locks on the build machine (parts/uv.j2), telling uv the target's Python
    on a RUN line: `--python-version {{ cell.python }}` put the matrix value there as shell text (the tests above
    render single-platform cells only, which never reach that line)."""
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    two = dataclasses.replace(base, template=template, platforms=("linux/amd64", "linux/arm64"))
    benign = _python_version_words(_render(TEMPLATES, dataclasses.replace(two, python="3.12")))
    hostile = _python_version_words(_render(TEMPLATES, dataclasses.replace(two, python=value)))
    assert all(found == ("3.12", [], "") for found in benign)
    assert hostile == [(value, [], "")] * len(benign)
    assert benign or template != "images/pip.Dockerfile.j2"


@pytest.mark.parametrize("key", ["pytorch-cuda:2.13", "pytorch-ngc:25.10"])
@pytest.mark.parametrize("value", [*HOSTILE, LABEL_TEXT, f'13.0" {label_keys.OCI_REVISION}="forged', "13.0}x"])
def test_a_gpu_cells_cuda_never_breaks_out_of_its_env_or_label(key: str, value: str):
    """parts/nvidia.j2 put `cell.cuda` bare into the ENV default `${NVIDIA_REQUIRE_CUDA:-cuda>=...}` and inside
    plain double quotes on its LABEL: a quote in it ended the word, and what followed became another ENV variable or
    LABEL of the matrix's choosing (a forged revision label). Now such a value is refused in one line."""
    base = next(c for c in MATRIX.cells if c.key == key)
    labels, problems = _labels(_render(TEMPLATES, dataclasses.replace(base, cuda="13.0")))
    assert problems == [] and labels[label_keys.CUDA] == "13.0"
    with pytest.raises(TemplateError, match="an ENV value .* holds a character other than") as caught:
        _render(TEMPLATES, dataclasses.replace(base, cuda=value))
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)
