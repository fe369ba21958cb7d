"""Render the generated files (Dockerfiles, catalogue) from the matrix and templates.

Rendering needs no Docker engine and is a pure function of matrix + templates + the cells'
apt.lock files (their pins go into the apt step), so it is byte-identical across runs and
machines. Writes are all-or-nothing: everything is rendered in memory first, then staged
next to its target and moved into place.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import shlex
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from buildtool.common.errors import UserError
from buildtool.contracts import frameworks, label_keys, platforms
from buildtool.contracts.apt_lock_format import (
    APT_LOCK,
    BASE_DPKG,
    DEB_HASHES,
    NOT_SERVED,
    parse_apt_lock,
    parse_deb_hashes,
    parse_entries,
)
from buildtool.contracts.locks import TOOLS_LOCK, UV_LOCK, parse_lock, platform_folder, uv_requirement
from buildtool.matrix.schema import Cell, Matrix, Run, StandIn

GENERATED_DIRS = ("dockerfiles",)
# A folder where generated files sit beside hand-written ones (a site's own workflows): a file there is generated
# when it starts with the mark every generated file starts with, so one that no render produces any more is stale.
GENERATED_MARK = b"# GENERATED FILE - DO NOT EDIT."
MARKED_DIRS = (".github/workflows",)
_BLANK_RUNS = re.compile(r"\n{3,}")


class TemplateError(UserError):
    """A template could not be rendered for a cell (exit 2)."""


_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


class UnsafeValue(TemplateError):
    """A value that would change the Dockerfile's structure (exit 2)."""


def _one_line(value: object, what: str, where: str = "matrix.yaml") -> None:
    """A string from the matrix (or a framework.yaml, WHERE) never holds a line break (nor another control
    character): in a Dockerfile it would end the instruction it sits in and start one of the file's choosing."""
    if isinstance(value, str):
        if _LINE_BREAKS.search(value):
            raise UnsafeValue(f"{what} {value!r} contains a line break or control character; it cannot go into "
                              f"a Dockerfile (fix it in {where})")
    elif isinstance(value, tuple | list):
        for item in value:
            _one_line(item, what, where)


def sh_word(value: object) -> str:
    """`| sh`: a value that reaches a shell (RUN lines) as exactly one inert word."""
    text = str(value)
    _one_line(text, "a value on a RUN line")
    return shlex.quote(text)


def label_value(value: object) -> str:
    """`| label`: a double-quoted Dockerfile word (LABEL values): `\\`, `"` and `$` escaped, so the
    value is one word and no build variable is substituted into it."""
    text = str(value)
    _one_line(text, "a LABEL value")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


_PLAIN_WORD = re.compile(r"[A-Za-z0-9._+-]+")


def env_word(value: object) -> str:
    """`| env_word`: a value inside an ENV default (`${VAR:-cuda>=VALUE}`): letters, digits and `. _ + -` only;
    a quote, space, `$` or `}` would end the word or the default there and add what follows to the ENV line."""
    text = str(value)
    _one_line(text, "an ENV value")
    if not _PLAIN_WORD.fullmatch(text):
        raise UnsafeValue(f"an ENV value {text!r} holds a character other than letters, digits and . _ + -; it "
                          "cannot go into a Dockerfile (fix it in matrix.yaml)")
    return text


class _Environment(jinja2.Environment):
    """Checks every value a template reads from a cell or a framework's row (see `_one_line`)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        value = super().getattr(obj, attribute)
        if isinstance(obj, Cell | Run | StandIn):
            _one_line(value, f"{type(obj).__name__.lower()}.{attribute}")
        elif isinstance(obj, frameworks.Framework):
            _one_line(value, attribute, f"image-tests/{obj.name}/framework.yaml")
        return value


class _Loader(jinja2.FileSystemLoader):
    """Templates are UTF-8; a file that is not is named with its line."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Callable[[], bool]]:
        try:
            return super().get_source(environment, template)
        except UnicodeDecodeError as exc:
            data = exc.object if isinstance(exc.object, bytes) else b""
            line = data.count(b"\n", 0, exc.start) + 1
            raise TemplateError(f"templates/{template}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                                "save the template as UTF-8") from None


def _framework_part(name: str) -> tuple[str, str, Callable[[], bool]] | None:
    """`framework/<framework>/<file>.j2`: a template part in the framework's own folder."""
    framework, _, part = name.partition("/")
    try:
        row = frameworks.get(framework)
    except KeyError:
        return None
    if row.folder is None or part not in {p.rsplit("/", 1)[-1] for p in row.template_parts}:
        return None   # only the parts its framework.yaml lists, never any file of the folder
    path = row.folder / part
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"{row.folder.name}/{part}: cannot read the template part ({exc})") from None
    mtime = path.stat().st_mtime
    return source, str(path), lambda: path.is_file() and path.stat().st_mtime == mtime


def _environment(templates_dir: Path) -> jinja2.Environment:
    env = _Environment(
        loader=jinja2.ChoiceLoader([
            _Loader(str(templates_dir)),
            jinja2.PrefixLoader({"framework": jinja2.FunctionLoader(_framework_part)}),
        ]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # Every matrix value on a RUN line goes through `| sh`, every LABEL value through `| label`, every ENV value
    # through `| env_word`.
    env.filters.update(sh=sh_word, label=label_value, env_word=env_word)
    return env


def _tidy(text: str) -> str:
    """Stable whitespace: no trailing spaces, at most one blank line, one final newline."""
    lines = [line.rstrip() for line in text.splitlines()]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n") + "\n"


def _template_location(exc: BaseException, templates_dir: Path) -> str:
    """Innermost template frame of a Jinja2 error, as `templates/<file>:<line>`."""
    found = [f"templates/{Path(frame.f_code.co_filename).relative_to(templates_dir)}:{line}"
             for frame, line in traceback.walk_tb(exc.__traceback__)
             if frame.f_code.co_filename.startswith(str(templates_dir))]
    return found[-1] if found else ""


def uv_pin(templates_dir: Path) -> dict[str, str]:
    """The pinned uv (templates/uv.lock): its version and one hashed requirement line."""
    path = templates_dir / UV_LOCK
    try:
        version, requirement = uv_requirement(path.read_text())
    except (OSError, ValueError) as exc:
        raise TemplateError(f"templates/{UV_LOCK}: {exc}; run `make lock` to write it") from None
    return {"version": version, "requirement": requirement}


def _lock_folder(root: Path, cell: Cell, platform: str | None) -> tuple[platforms.Platform, Path]:
    """contracts.locks.platform_folder of the cell's Dockerfile under `root`, its refusal a TemplateError."""
    try:
        return platform_folder((root / cell.dockerfile).parent, cell.key, cell.platforms, platform)
    except UserError as exc:
        raise TemplateError(str(exc)) from None


def _read_pins(root: Path, cell: Cell, platform: str | None) -> tuple[str, Path, list[str] | None]:
    """(architecture, lock folder, pins of its apt.lock) of one platform (None: the cell's only one); the pins
    None when the file is not there."""
    known, folder = _lock_folder(root, cell, platform)
    path = folder / APT_LOCK
    if not path.is_file():
        return known.architecture, folder, None
    rel = path.relative_to(root)
    try:
        lock = parse_apt_lock(path.read_text())
    except ValueError as exc:
        raise TemplateError(f"{rel}: {exc}; run `make lock FRAMEWORK={cell.key}`") from None
    if lock.header["arch"] != known.architecture:
        raise TemplateError(f"{rel} was resolved for {lock.header['arch']}, not {known.architecture}; "
                            f"run `make lock FRAMEWORK={cell.key}`")
    if not lock.digest_matches():
        # A hand-edited pin (well formed, but not what `buildtool lock` resolved) never reaches a Dockerfile.
        raise TemplateError(f"{rel}: its entries no longer match its recorded digest ({lock.header['entries']}): "
                            f"it was edited by hand; run `make lock FRAMEWORK={cell.key}`")
    return known.architecture, folder, lock.pins()


def apt_pins(root: Path | None, cell: Cell) -> dict[str, Any] | None:
    """The cell's apt.lock (beside its Dockerfile under `root`, the project) as the template installs it;
    None when there is none (the template then renders a step that stops the build). A lock that does not
    parse is an error. A multi-platform cell: `by_arch`, each platform's architecture -> its pins (None
    where that platform's lock is missing: the build of that platform stops)."""
    if root is None:
        return None
    if not cell.multi_platform:
        pins = _read_pins(root, cell, None)[2]
        return None if pins is None else {"pins": pins}
    read = [_read_pins(root, cell, p) for p in cell.platforms]
    by_arch = {arch: pins for arch, _, pins in read}
    if all(pins is None for pins in by_arch.values()):
        return None
    found: dict[str, Any] = {"by_arch": by_arch}
    if cell.native_installs:
        found["debs_by_arch"] = {arch: None if pins is None else _with_deb_hashes(root, cell, folder, pins)
                                 for arch, folder, pins in read}
    return found


def _with_deb_hashes(root: Path, cell: Cell, folder: Path, pins: list[str]) -> list[str]:
    """`name=version sha256` for each pin of one platform (its locks in `folder`), the sha256 its debs.sha256
    records; NOT_SERVED where it records none (or has no line, or no file): the rendered fetch of that .deb stops
    the build, naming it, as a missing apt.lock does. A debs.sha256 that does not parse is an error."""
    path = folder / DEB_HASHES
    hashes: dict[str, str] = {}
    if path.is_file():
        try:
            hashes = parse_deb_hashes(path.read_text(), str(path.relative_to(root)))
        except ValueError as exc:
            raise TemplateError(f"{exc}; run `make lock FRAMEWORK={cell.key}`") from None
    return [f"{pin} {hashes.get(pin, NOT_SERVED)}" for pin in pins]


def target_archs(cell: Cell) -> list[str] | None:
    """The architectures (BuildKit's TARGETARCH) a multi-platform cell's Dockerfile selects among; None for
    a cell built for the default platform only (its Dockerfile names no platform)."""
    return [platforms.get(p).architecture for p in cell.platforms] if cell.multi_platform else None


_GLIBC = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)")


def wheel_platforms(root: Path | None, cell: Cell) -> dict[str, str]:
    """TARGETARCH -> uv's --python-platform for installing, for each platform of the cell: its machine and the
    glibc of the base the wheels land in, so uv picks the file pip in the image would. A pip cell reads libc6 in
    that platform's base.dpkg; an NGC cell (no framework requirements: the base carries the framework) reads the
    base glibc its pylock.tools.toml records (`make lock` asks the base, lock.platform_bases). The lock was resolved
    under Platform.wheel_platform's lower cap (which fixes the versions) and lists every wheel of each version up to
    lock.NEWEST_MANYLINUX.
    Installing under that cap took xprof 2.21.6's cp311-none-any wheel, which carries a Windows .pyd, over its
    manylinux_2_35_aarch64 one (arm64 jax-cpu: no profile plugin). An architecture without that file, or no
    project, is left out (its build stops, naming it); a file that does not parse or names no glibc is an error."""
    if root is None:
        return {}
    found = {}
    for platform in cell.platforms:
        known, folder = _lock_folder(root, cell, platform)
        glibc = _base_glibc(folder, root, cell)
        if glibc is not None:
            found[known.architecture] = f"{known.machine}-manylinux_{glibc[0]}_{glibc[1]}"
    return found


def _base_glibc(folder: Path, root: Path, cell: Cell) -> tuple[str, str] | None:
    """(major, minor) of the glibc of the platform's base: libc6 in its base.dpkg for a pip cell, the `glibc` its
    pylock.tools.toml records ([tool.dl-images]) for an NGC cell; None where that file is missing (as a missing
    apt.lock: that architecture's build stops, naming it)."""
    pip = bool(cell.framework_requirements)
    path = folder / (BASE_DPKG if pip else TOOLS_LOCK)
    rel = path.relative_to(root)
    if not path.is_file():
        return None
    try:
        text = path.read_text()
        glibc = parse_entries(text, BASE_DPKG).get("libc6", "") if pip else parse_lock(text).glibc
    except ValueError as exc:
        raise TemplateError(f"{rel}: {exc}; run `make lock FRAMEWORK={cell.key}`") from None
    found = _GLIBC.match(glibc) if pip else re.fullmatch(r"([0-9]+)\.([0-9]+)", glibc)
    if found is None:
        why = (f"names no libc6 version ({glibc!r}), so the wheels' glibc is unknown" if pip else
               "names no glibc of its base (`glibc` in [tool.dl-images]), so the wheels' platform is unknown")
        raise TemplateError(f"{rel} {why}; run `make lock FRAMEWORK={cell.key}`")
    return found[1], found[2]


def render_dockerfile(env: jinja2.Environment, templates_dir: Path, matrix: Matrix, cell: Cell,
                      root: Path | None = None) -> str:
    context = {
        "cell": cell,
        "framework": frameworks.get(cell.framework),
        "matrix_path": Path(matrix.path).name,
        "source": matrix.source,
        "label_keys": label_keys,
        "pinned_packages": [f"{name}=={version}" for name, version in cell.packages],
        "uv": uv_pin(templates_dir),
        "apt": apt_pins(root, cell),
        "not_served": NOT_SERVED,
        # Multi-platform cells: each lock is in its architecture's folder, chosen by BuildKit's TARGETARCH.
        "archs": target_archs(cell),
        # Native installs: uv's --python-platform of each architecture (its machine and its base's glibc).
        "wheel_platforms": wheel_platforms(root, cell) if cell.native_installs else {},
        # TARGETARCH -> the e_machine of its ELF files (the native NGC install checks what it copies).
        "elf_machines": {p.architecture: p.elf_machine for p in map(platforms.get, cell.platforms)},
        # NGC cells (and their stand-ins) bring Python and the framework; only tools are installed.
        "ngc": not cell.framework_requirements,
    }
    for key in ("matrix_path", "source", "pinned_packages"):
        _one_line(context[key], key)
    try:
        return _tidy(env.get_template(cell.template).render(context))
    except TemplateError:
        raise
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"templates/{exc.name or cell.template}:{exc.lineno}: {exc.message}") from None
    except Exception as exc:  # noqa: BLE001 - any other mistake in a template is the template's, not ours
        where = _template_location(exc, templates_dir) or f"templates/{cell.template}"
        if isinstance(exc, jinja2.UndefinedError):
            problem = f"{exc.message} for cell {cell.key}; define it in matrix.yaml or fix the template"
        elif isinstance(exc, jinja2.TemplateNotFound):
            problem = f"includes missing template {exc.name!r} (cell {cell.key})"
        else:
            detail = " ".join(str(exc).split()) or type(exc).__name__
            problem = f"{type(exc).__name__}: {detail} (cell {cell.key}); fix the template"
        raise TemplateError(f"{where}: {problem}") from None


def render_cell_dockerfile(matrix: Matrix, cell: Cell, templates_dir: Path, root: Path | None = None) -> str:
    """One cell's Dockerfile as `render` writes it (with `root`, the project whose apt locks it pins),
    rendered in memory (nothing is written)."""
    return render_dockerfile(_environment(templates_dir), templates_dir, matrix, cell, root)


@dataclass(frozen=True)
class Outputs:
    """Every generated file, relative path -> bytes, plus the folders it owns."""

    files: dict[str, bytes]

    def stale(self, root: Path) -> list[str]:
        """Generated-looking files on disk that no cell renders any more."""
        owned = {str(p.relative_to(root)) for folder in GENERATED_DIRS if (root / folder).is_dir()
                 for p in (root / folder).rglob("Dockerfile") if p.is_file()}
        owned |= {str(p.relative_to(root)) for folder in MARKED_DIRS if (root / folder).is_dir()
                  for p in (root / folder).iterdir() if _marked(p)}
        return sorted(owned - set(self.files))


def _marked(path: Path) -> bool:
    """Whether `path` is a file that starts with GENERATED_MARK (one that cannot be read is not known to be)."""
    if not path.is_file():     # asked first: opening a named pipe waits for a writer
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(len(GENERATED_MARK)) == GENERATED_MARK
    except OSError:
        return False


Extra = Callable[[Matrix], dict[str, bytes]]


def render_outputs(matrix: Matrix, templates_dir: Path, extras: tuple[Extra, ...] = (),
                   root: Path | None = None) -> Outputs:
    """Render everything in memory; raises before anything is written. `root`: the project whose cells'
    apt.lock files the Dockerfiles pin (None: none, every apt step renders as one that stops the build)."""
    env = _environment(templates_dir)
    files = {cell.dockerfile: render_dockerfile(env, templates_dir, matrix, cell, root).encode()
             for cell in matrix.cells}
    for extra in extras:
        files.update(extra(matrix))
    return Outputs(files=files)


def write_outputs(root: Path, outputs: Outputs) -> list[str]:
    """Write the changed files (their relative paths returned) all or nothing: each is staged beside its target, and
    only when every one is staged are they renamed into place, so a failure leaves the tree as it was (the folders
    made for new cells removed too)."""
    changed = [rel for rel, data in sorted(outputs.files.items())
               if not (root / rel).is_file() or (root / rel).read_bytes() != data]
    staged: list[tuple[str, Path]] = []
    made: list[Path] = []
    done: list[str] = []   # renamed into place: undone on a failure
    try:
        for rel in changed:
            target = root / rel
            _make_folder(target.parent, made)
            fd, name = tempfile.mkstemp(prefix=".render-", dir=target.parent)
            staged.append((rel, Path(name)))    # before writing: a failed write or chmod removes it too
            with os.fdopen(fd, "wb") as handle:
                handle.write(outputs.files[rel])
            os.chmod(name, 0o644)
        # Keep the old bytes so a failure half-way through the renames can be undone (inside the try: a failed
        # read removes the staged files too).
        previous = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel, _ in staged}
        for rel, path in staged:
            os.replace(path, root / rel)
            done.append(rel)
    except BaseException:
        for rel in done:
            old = previous[rel]
            if old is None:
                (root / rel).unlink(missing_ok=True)
            else:
                (root / rel).write_bytes(old)
        for _, path in staged:
            path.unlink(missing_ok=True)
        _remove_folders(made)
        raise
    return changed


def _make_folder(folder: Path, made: list[Path]) -> None:
    """`mkdir -p folder`, adding each folder it made (outermost first) to `made`."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue   # made meanwhile by someone else: not ours to remove
        made.append(path)


def _remove_folders(made: list[Path]) -> None:
    """Undo `_make_folder`: deepest first, each only if empty (what is in it now is not ours)."""
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def drift(root: Path, outputs: Outputs) -> tuple[str, list[str]]:
    """Unified diff of committed files against what the matrix renders, and stale files."""
    chunks: list[str] = []
    for rel, data in sorted(outputs.files.items()):
        path = root / rel
        # Bytes, as `render` compares them: text mode would read a committed CRLF (or CR) as the LF rendered. The
        # diff shows a byte that is not UTF-8 as \xNN and a carriage return as \r, so the drift can be seen.
        committed = _committed(path, rel)
        current = committed or b""
        if current != data:
            shown = current.decode("utf-8", "backslashreplace").replace("\r", "\\r")
            chunks.extend(difflib.unified_diff(
                shown.splitlines(keepends=True), data.decode().splitlines(keepends=True),
                fromfile=f"a/{rel}" if committed is not None else "/dev/null", tofile=f"b/{rel}"))
    return "".join(chunks), outputs.stale(root)


def _committed(path: Path, rel: str) -> bytes | None:
    """The bytes of generated file `rel` at `path`, None when nothing is there. Something there that cannot be read
    as a file (a folder, a symlink to nothing or a loop, no read permission) is a UserError naming it: never read as
    missing, never a traceback."""
    if not os.path.lexists(path):
        return None
    why = "it is a folder" if path.is_dir() else "" if path.is_file() else \
        "it is not a regular file (a symlink to nothing or a loop, a pipe or a device)"
    if not why:    # a pipe is never opened: reading it would wait for a writer
        try:
            return path.read_bytes()
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
    raise UserError(f"the generated file {rel} cannot be read: {why}; remove it (or make it readable) and run "
                    "`make render`")


def prune(root: Path, stale: list[str]) -> None:
    """Remove stale generated files (only when asked) and the empty folders they leave."""
    for rel in stale:
        path = root / rel
        path.unlink()
        parent = path.parent
        while parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
