"""The worked example of image-tests/README.md ("Adding a check"), run without an engine: its testinfra check
against a stand-in container that runs the harness's commands on this machine, under the real supervisor, through
the backend every image test's `host` has (image-tests/infra.py). What the example promises: a healthy CA setup
passes; none fails naming where it looked; a command that hangs is stopped and named, one that cannot start names
why, as the first line of the test's failure. (tests/integration/test_image_faults.py's `ca-certificates-removed`
runs the same check in a real image without CA certificates.) Also the backend's /proc/net reading of sockets,
which images without `ss` or `netstat` need."""

from __future__ import annotations

import shutil
import socket
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
import infra  # noqa: E402
import test_ca_certs  # noqa: E402

TEST = TESTS_DIR / "common" / "test_ca_certs.py"


class HostContainer:
    """harness.Container as the testinfra backend calls it (`run(argv, step=...)`), on this machine: every command
    runs under scripts/supervise.py with `env` as its whole environment, as in an image."""

    name = "stand-in"

    def __init__(self, out: Path, env: dict[str, str], quiet: float = harness.QUIET_S) -> None:
        self.out, self.env, self.quiet = out, env, quiet

    def run(self, argv: list[str], *, step: str, quiet: float = harness.QUIET_S,
            env: dict[str, str] | None = None) -> harness.Probe:
        quiet = min(quiet, self.quiet)
        probe = harness.Probe(step=step, argv=list(argv), quiet=float(quiet), bound=60)
        host_dir = self.out / uuid.uuid4().hex[:8]
        host_dir.mkdir(parents=True)
        subprocess.run([sys.executable, "-I", "-S", str(harness.SCRIPTS / "supervise.py"), str(host_dir), "60",
                        str(quiet), f"unit-{host_dir.name}", "--", *argv],
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


def _host(tmp_path: Path, env: dict[str, str], quiet: float = harness.QUIET_S) -> infra.ImageHost:
    return infra.host_of(HostContainer(tmp_path / "out", env, quiet))


def test_the_check_passes_where_python_trusts_ca_certificates(tmp_path):
    test_ca_certs.test_python_trusts_the_system_ca_certificates(_host(tmp_path, _ca_env(tmp_path, True)))


def test_the_check_fails_naming_where_it_looked_when_no_ca_is_trusted(tmp_path):
    env = _ca_env(tmp_path, False)
    with pytest.raises(AssertionError) as failed:
        test_ca_certs.test_python_trusts_the_system_ca_certificates(_host(tmp_path, env))
    first = str(failed.value).splitlines()[0]
    assert first.startswith("Python's default SSL context trusts no CA certificate "
                            f"(none in {env['SSL_CERT_FILE']} or {env['SSL_CERT_DIR']})"), first
    assert "CERTIFICATE_VERIFY_FAILED; install ca-certificates" in first, first


def _hashed_folder(tmp_path: Path, target_exists: bool) -> dict[str, str]:
    """No CA file; a CA folder whose one hashed name links to a certificate (this machine's bundle), or to a file
    that is gone (a certificate removed, its hashed link left behind)."""
    env = _ca_env(tmp_path, certs=False)
    certificate = tmp_path / "ca.pem"
    if target_exists:
        default = ssl.get_default_verify_paths()
        shutil.copyfile(default.cafile or default.openssl_cafile, certificate)
    (Path(env["SSL_CERT_DIR"]) / "5ad8a5d6.0").symlink_to(certificate)
    return env


def test_a_ca_folder_of_hashed_links_that_lead_nowhere_fails(tmp_path):
    """Before: passed, counting the hashed names of the CA folder whatever they lead to."""
    env = _hashed_folder(tmp_path, target_exists=False)
    with pytest.raises(AssertionError) as failed:
        test_ca_certs.test_python_trusts_the_system_ca_certificates(_host(tmp_path, env))
    assert str(failed.value).startswith("Python's default SSL context trusts no CA certificate "
                                        f"(none in {env['SSL_CERT_FILE']} or {env['SSL_CERT_DIR']})"), failed.value


def test_a_ca_folder_whose_hashed_link_leads_to_a_certificate_passes(tmp_path):
    test_ca_certs.test_python_trusts_the_system_ca_certificates(_host(tmp_path, _hashed_folder(tmp_path, True)))


def test_a_command_that_hangs_is_stopped_and_named_as_the_first_line(tmp_path):
    """What the backend keeps of the harness: a testinfra command is supervised, never left to hang."""
    host = _host(tmp_path, {}, quiet=2)
    with pytest.raises(pytest.fail.Exception) as failed:
        host.run("sleep 300")
    assert str(failed.value).startswith("`sleep 300` hung: no CPU or I/O for 2 s; killed after"), str(failed.value)


def test_a_command_that_cannot_start_names_why_and_a_failing_one_is_testinfras_answer(tmp_path):
    host = _host(tmp_path, {"PATH": str(tmp_path / "nothing")})   # no /bin/sh on PATH is fine: it is run by path
    done = host.run("exit 3")
    assert done.rc == 3 and not done.stdout
    probe = harness.Probe(step="`true`", argv=["/bin/sh"], error="/bin/sh: not found in the image (PATH=/x)")
    container = HostContainer(tmp_path / "out", {})
    container.run = lambda argv, step, **kw: probe   # type: ignore[method-assign]
    with pytest.raises(pytest.fail.Exception) as failed:
        infra.host_of(container).run("true")
    assert str(failed.value) == "`true`: /bin/sh: not found in the image (PATH=/x)"


def test_output_and_environment_come_back_whole(tmp_path):
    host = _host(tmp_path, {"LANG": "C.UTF-8", "IMGTEST_X": "a=b"})
    assert host.environment()["IMGTEST_X"] == "a=b"
    big = host.check_output("head -c 300000 /dev/zero | tr '\\0' x")
    assert len(big) == 300000                     # the supervisor's stdout file, not the 20 kB tail for people
    assert host.check_output("printf %s", "é") == "é"


@pytest.mark.parametrize(("field", "address"), [
    ("0100007F:1F90", ("127.0.0.1", 8080)),
    ("00000000:0016", ("0.0.0.0", 22)),
    ("00000000000000000000000001000000:1F90", ("::1", 8080)),
    ("00000000000000000000000000000000:0050", ("::", 80)),
])
def test_proc_net_addresses_read_as_the_kernel_writes_them(field, address):
    assert infra._address(field) == address


def test_sockets_without_ss_or_netstat_come_from_proc_net(tmp_path):
    host = _host(tmp_path, {})
    sockets = infra.ProcNetSocket.get_module(host)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not sockets(f"tcp://127.0.0.1:{port}").is_listening      # bound, not listening yet
        server.listen()
        assert sockets(f"tcp://127.0.0.1:{port}").is_listening
        assert f"tcp://127.0.0.1:{port}" in sockets.get_listening_sockets()
        assert not sockets(f"tcp://0.0.0.0:{port}").is_listening


def test_the_readme_shows_the_example_as_it_is():
    """The worked example in image-tests/README.md is this file, verbatim (it cannot drift)."""
    readme = (TESTS_DIR / "README.md").read_text()
    assert TEST.read_text().strip() in readme, f"image-tests/README.md no longer shows {TEST.name} as it is"
