"""The toolkit's own dependencies: ranges in pyproject.toml, exact pins in requirements.lock (made by
scripts/lock-deps.sh), and the lock is what scripts/setup.sh installs with."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"requirements.lock: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project["dependencies"], *extras.get("dev", []), *extras.get("scaling", [])]]


def test_every_declared_dependency_is_a_range_and_its_locked_version_is_inside_it() -> None:
    pins = _lock()
    for req in _declared():
        assert not any(spec.operator in ("==", "===") for spec in req.specifier), (
            f"pyproject.toml pins {req} exactly: declare a range, the exact version goes in requirements.lock")
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared but not in requirements.lock: run `make lock-deps`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock has {req.name} {pins[name]}, outside pyproject.toml's {req.specifier}: "
            "run `make lock-deps`")


@pytest.mark.parametrize("script", ["scripts/setup.sh", "scripts/setup-tests.sh"])
def test_setup_installs_with_the_lock_as_constraints(script: str) -> None:
    setup = (ROOT / script).read_text()
    assert "-c requirements.lock" in setup or '-c "$ROOT/requirements.lock"' in setup
    stamp = next(line for line in setup.splitlines() if line.startswith("stamp="))
    assert "requirements.lock" in stamp   # a new lock reinstalls


def test_setup_installs_the_uv_the_lock_pins() -> None:
    """uv is on PyPI: setup.sh puts the version requirements.lock pins into .venv and installs with it."""
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "grep -E '^uv==' \"$ROOT/requirements.lock\"" in setup and '"uv==$uv_pin"' in setup
    assert "uv pip install" in setup and "-m pip install -q -c" not in setup
    assert _lock()["uv"]


def test_the_check_can_fail(tmp_path: Path) -> None:
    req = Requirement("pydantic>=2.13.4,<3")
    assert not req.specifier.contains(Version("3.0.0"))


def test_what_runs_the_image_tests_is_a_runtime_dependency_and_is_used() -> None:
    """`buildtool validate` runs image-tests/ with this package's own Python: pytest, its xdist workers and
    pytest-testinfra (every check that inspects an image goes through testinfra's `host`, image-tests/infra.py)
    are runtime dependencies, pinned, and testinfra is really imported there."""
    runtime = {canonicalize_name(Requirement(r).name)
               for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert {"pytest", "pytest-testinfra", "pytest-xdist"} <= runtime
    assert {"pytest", "pytest-testinfra", "pytest-xdist"} <= set(_lock())
    infra = (ROOT / "image-tests" / "infra.py").read_text()
    assert "import testinfra.host" in infra and "from testinfra.backend.base import BaseBackend" in infra
    uses = [p.name for p in (ROOT / "image-tests" / "common").glob("test_*.py") if "(host" in p.read_text()
            or ", host" in p.read_text()]
    assert len(uses) >= 6, uses
