"""The worked example of image-tests/README.md ("Adding a check"), run without an engine: its script
and its test, through the harness's calling style (`Container.result`), against a stand-in container
that runs /imagetests scripts with this machine's Python under the real supervisor. What the example
promises: a healthy CA setup passes; none fails naming where it looked; a probe that hangs is stopped
and named; one that fails names its cause. (tests/integration/test_image_faults.py's `ca-certificates-
removed` runs the same check in a real image without CA certificates.)"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO / "image-tests"
sys.path.insert(0, str(TESTS_DIR))
sys.path.insert(0, str(TESTS_DIR / "common"))
import harness  # noqa: E402
import test_ca_certs  # noqa: E402

SCRIPT = TESTS_DIR / "scripts" / "ca_certs.py"
TEST = TESTS_DIR / "common" / "test_ca_certs.py"


class HostContainer:
    """harness.Container as a check calls it (`result`, `python`, `run`), on this machine: `python3` is
    this Python, /imagetests is `scripts`, and every probe runs under scripts/supervise.py as in an image."""

    python = harness.Container.python
    result = harness.Container.result

    def __init__(self, out: Path, env: dict[str, str], scripts: Path = harness.SCRIPTS) -> None:
        self.out, self.env, self.scripts = out, env, scripts

    def run(self, argv: list[str], *, step: str, quiet: float = harness.QUIET_S,
            env: dict[str, str] | None = None) -> harness.Probe:
        probe = harness.Probe(step=step, argv=list(argv), quiet=float(quiet), bound=60)
        host_dir = self.out / uuid.uuid4().hex[:8]
        host_dir.mkdir(parents=True)
        local = [sys.executable if a == "python3" else a.replace(harness.SCRIPTS_IN, str(self.scripts)) for a in argv]
        subprocess.run([sys.executable, "-I", "-S", str(harness.SCRIPTS / "supervise.py"), str(host_dir), "60",
                        str(quiet), f"unit-{host_dir.name}", "--", *local],
                       env={"PATH": "/usr/bin:/bin", **self.env, **(env or {})}, check=True, timeout=quiet + 60)
        assert probe.read_record(host_dir), "the supervisor left no record"
        return probe


def _ca_env(tmp_path: Path, certs: bool) -> dict[str, str]:
    """SSL_CERT_FILE and SSL_CERT_DIR: this machine's CA bundle, or nothing (an empty folder)."""
    folder = tmp_path / "certs"
    folder.mkdir()
    bundle = folder / "bundle.pem"
    if certs:
        default = ssl.get_default_verify_paths()
        source = default.cafile or default.openssl_cafile
        if not Path(source).is_file():
            pytest.fail(f"this machine has no CA bundle at {source} to stand for a healthy image's")
        shutil.copyfile(source, bundle)
    return {"SSL_CERT_FILE": str(bundle), "SSL_CERT_DIR": str(folder)}


def test_the_check_passes_where_python_trusts_ca_certificates(tmp_path):
    test_ca_certs.test_python_trusts_the_system_ca_certificates(HostContainer(tmp_path, _ca_env(tmp_path, True)))


def test_the_check_fails_naming_where_it_looked_when_no_ca_is_trusted(tmp_path):
    env = _ca_env(tmp_path, False)
    with pytest.raises(AssertionError) as failed:
        test_ca_certs.test_python_trusts_the_system_ca_certificates(HostContainer(tmp_path, env))
    first = str(failed.value).splitlines()[0]
    assert first.startswith("Python's default SSL context trusts no CA certificate "
                            f"(none in {env['SSL_CERT_FILE']} or {env['SSL_CERT_DIR']})"), first
    assert "CERTIFICATE_VERIFY_FAILED; install ca-certificates" in first, first


@pytest.mark.parametrize(("code", "cause"), [
    ("import time; time.sleep(300)", "probe the example hung: no CPU or I/O for 2 s; killed after"),
    ("raise SystemExit('no ssl module here')", "probe the example exited with 1: no ssl module here"),
    ("print('a result printed, not written')", "probe the example wrote no result"),
])
def test_a_check_that_hangs_or_breaks_fails_naming_its_cause(tmp_path, code, cause):
    """What `Container.result` keeps of the harness: a hung probe is stopped within its quiet window and
    named, a broken one names its cause, as the first line of the test's failure."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "example.py").write_text(code + "\n")
    container = HostContainer(tmp_path / "out", {}, scripts)
    with pytest.raises(pytest.fail.Exception) as failed:
        container.result("example.py", step="probe the example", quiet=2)
    assert str(failed.value).startswith(cause), str(failed.value)


def test_the_readme_shows_the_example_as_it_is():
    """The worked example in image-tests/README.md is these two files, verbatim (it cannot drift)."""
    readme = (TESTS_DIR / "README.md").read_text()
    for path in (SCRIPT, TEST):
        assert path.read_text().strip() in readme, f"image-tests/README.md no longer shows {path.name} as it is"
