"""The release command's input checks and table, without a registry."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from buildtool.cli.release_run import print_report
from buildtool.release.promote import ImageRelease, ReleaseReport


def test_table_prints_test_ids_with_brackets_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    item = ImageRelease(cell="pytorch-cpu:2.13", image="pytorch-cpu", source="s", release_repo="r",
                        status="refused", problems=["skipped: common/test_run_profile.py::test_ulimit[memlock] (x)"])
    print_report(ReleaseReport("0.1.0", "abc[1]", [item]))
    out = capsys.readouterr().out
    assert "test_ulimit[memlock]" in out and "abc[1]" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--version", "0.1.0", "--from", "no/such-branch"], "--from 'no/such-branch' is neither a commit"),
    (["--version", "x.y"], "--version 'x.y' is not a version"),
    (["--version", "0.1.0", "--accept-skip", "("], "--accept-skip '(': not a skip code (CODE or CODE:SUBJECT"),
    (["--version", "0.1.0", "--accept-skip", "no-such-code"], "--accept-skip 'no-such-code': no such skip code "
                                                               "(waivable codes: ulimit-not-granted, no-peer-image)"),
    (["--version", "0.1.0", "--accept-skip", "no-gpu-on-runner"], "--accept-skip 'no-gpu-on-runner': no-gpu-on-runner "
                                                                   "cannot be waived"),
    (["--version", "0.1.0", "--framework", "nope"], "unknown FRAMEWORK='nope'"),
])
def test_bad_input_is_one_line_and_exit_2(project, run_cli, args, message) -> None:  # noqa: ANN001
    code, out, err = run_cli("release", *args, "--matrix", str(project / "matrix.yaml"))
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (project / "docs/releases").exists()


def test_unreachable_registry_is_exit_2_naming_the_fix(project, run_cli, monkeypatch, no_registry_backoff) -> None:  # noqa: ANN001
    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")     # nothing listens on port 1
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu",
                             "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "registry 127.0.0.1:1 is unreachable" in err and "REGISTRY" in err
    assert not (project / "docs/releases").exists()


# -- --json: always one JSON document on stdout ---------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--version", "x.y"],                                        # bad input (exit 2)
    ["--version", "0.1.0", "--bogus-option"],                    # a usage error typer answers (exit 2)
])
def test_json_document_on_bad_input(project, run_cli, args) -> None:  # noqa: ANN001
    code, out, err = run_cli("release", *args, "--json", "--matrix", str(project / "matrix.yaml"))
    assert code == 2
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["release"] is None and doc["error"]


def test_json_document_when_the_registry_is_unreachable_or_failing(project, run_cli, monkeypatch) -> None:  # noqa: ANN001
    import buildtool.registry.client as registry_client
    from tests.faultproxy import FaultProxy

    monkeypatch.setattr(registry_client.RetryPolicy, "__init__", _fast_retry)
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--json",
                             "--matrix", str(project / "matrix.yaml"))
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and "unreachable" in doc["error"]
    # A registry that answers 503 to everything (the proxy never reaches its upstream).
    with FaultProxy(upstream=("127.0.0.1", 1)) as proxy:
        proxy.add(".*", "503", times=1000)
        monkeypatch.setenv("REGISTRY", proxy.address)
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--json",
                                 "--matrix", str(project / "matrix.yaml"))
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and "HTTP 503" in doc["error"], (out, err)


def _fast_retry(self, attempts: int = 2, first_delay: float = 0.01, max_delay: float = 0.01,  # noqa: ANN001
                timeout: float = 2.0) -> None:
    self.attempts, self.first_delay, self.max_delay, self.timeout = attempts, first_delay, max_delay, timeout


def test_version_released_under_another_spelling_in_release_files_is_refused(project, run_cli) -> None:  # noqa: ANN001
    (project / "docs/releases").mkdir(parents=True, exist_ok=True)
    (project / "docs/releases/1.0.json").write_text("{}")
    code, out, err = run_cli("release", "--version", "1.0.0", "-f", "pytorch-cpu", "--matrix",
                             str(project / "matrix.yaml"))
    assert code == 2 and "already exists as docs/releases/1.0.json" in err and "use --version 1.0" in err


def test_local_dev_key_is_trusted_only_for_a_loopback_registry(project, run_cli, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("REGISTRY", "registry.example.com/team")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--trust-local-key",
                             "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "--trust-local-key is only for a loopback registry" in err
    assert "config/trusted-keys.yaml" in err


# -- buildtool keys ---------------------------------------------------------------------------------

def test_keys_makes_a_pair_says_where_each_half_goes_and_never_overwrites(run_cli, tmp_path: Path) -> None:
    from buildtool.attest.dsse import load_private, load_public

    code, out, err = run_cli("keys", "--name", "gpu-runners", "--out", str(tmp_path))
    assert code == 0, err
    private, public = tmp_path / "gpu-runners.key", tmp_path / "gpu-runners.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_private(private.read_bytes(), "k")
    assert load_public(public.read_text(), "p").keyid == key.keyid and key.keyid in out
    assert "DL_IMAGES_SIGNING_KEY" in out and "config/trusted-keys.yaml" in out and "Never commit it" in out
    entry = out[out.index("  - name: gpu-runners"):]
    (tmp_path / "config").mkdir()
    (tmp_path / "config/trusted-keys.yaml").write_text("keys:\n" + entry)
    from buildtool.attest.keys import load_trusted

    assert list(load_trusted(tmp_path).keys) == [key.keyid]          # the printed entry is a valid trust entry
    code, out, err = run_cli("keys", "--name", "gpu-runners", "--out", str(tmp_path))
    assert code == 2 and "never overwritten" in err and private.read_bytes() == key.pem
    code, out, err = run_cli("keys", "--name", "Bad/Name", "--out", str(tmp_path))
    assert code == 2 and "--name" in err


def test_keys_dev_makes_the_local_dev_key_once(run_cli) -> None:
    code, first, err = run_cli("keys", "--dev")
    assert code == 0 and "--trust-local-key" in first
    code, second, _ = run_cli("keys", "--dev")
    assert first.split("key id ")[1][:64] == second.split("key id ")[1][:64]


def test_fast_path_parses_the_same_options_as_the_typer_command() -> None:
    """`buildtool release` is parsed without typer (start-up time); both must accept the same options."""
    import typer.main

    from buildtool.cli.app import app
    from buildtool.contracts.arguments import RELEASE_OPTIONS

    command = typer.main.get_command(app).commands["release"]  # type: ignore[attr-defined]
    typer_options = {tuple(sorted(p.opts)): (p.envvar, p.multiple, p.is_flag) for p in command.params}
    fast = {tuple(sorted(o.flags)): (o.envvar, o.kind == "append", o.kind == "flag") for o in RELEASE_OPTIONS}
    assert fast == typer_options


def test_fast_path_and_typer_agree_on_a_run(project, run_cli, monkeypatch) -> None:  # noqa: ANN001
    """The same bad version through either parser: the same one-line message and exit code."""
    import buildtool.cli as cli

    args = ["release", "--version", "x.y", "-f", "pytorch-cpu", "--matrix", str(project / "matrix.yaml")]
    fast = run_cli(*args)
    monkeypatch.setattr(cli, "_fast_path", lambda argv: False)
    assert run_cli(*args) == fast and fast[0] == 2 and "is not a version" in fast[2]


# -- issue 20, hole 1: loopback is an address, not a text prefix ------------------------------------

@pytest.mark.parametrize(("registry", "release_registry"), [
    ("127.attacker.invalid:5000/p", "127.attacker.invalid:5000/p/r"),      # the audit's command
    ("127.0.0.1.nip.io:5000/p", "127.0.0.1.nip.io:5000/p/r"),              # resolves to 127.0.0.1, still a name
    ("127.0.0.1:5000/p", "127.attacker.invalid:5000/p/r"),                 # only RELEASE_REGISTRY is remote
    ("127.attacker.invalid:5000/p", "127.0.0.1:5000/p/r"),                 # only REGISTRY is remote
    ("localhost.attacker.invalid:5000/p", None),
])
def test_trust_local_key_refuses_a_registry_whose_name_only_looks_loopback(
        project, run_cli, monkeypatch, registry, release_registry) -> None:  # noqa: ANN001
    monkeypatch.setenv("REGISTRY", registry)
    if release_registry is None:
        monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    else:
        monkeypatch.setenv("RELEASE_REGISTRY", release_registry)
    code, out, err = run_cli("release", "--version", "0.7.3", "-f", "pytorch-cpu", "--trust-local-key", "--dry-run",
                             "--matrix", str(project / "matrix.yaml"))
    remote = next(r for r in (registry, release_registry) if r and not r.startswith("127.0.0.1:"))
    assert code == 2 and "--trust-local-key is only for a loopback registry" in err, (code, err)
    assert remote.split("/")[0] in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:5000", True), ("127.5.6.7", True), ("localhost", True), ("localhost:5000", True),
    ("[::1]:5000", True), ("[::1]", True), ("::1", True),
    ("127.attacker.invalid:5000", False), ("127.0.0.1.nip.io:5000", False), ("localhost.example:5000", False),
    ("128.0.0.1:5000", False), ("[::2]:5000", False), ("LOCALHOST:5000", False), ("127.0.0.1:x", False),
    ("", False), ("registry.example.com", False), ("0.0.0.0:5000", False), ("[::ffff:127.0.0.1]:5000", False),
])
def test_one_loopback_predicate_decides_trust_and_plain_http(host: str, loopback: bool) -> None:
    from buildtool.common.refs import is_loopback_host
    from buildtool.registry.client import RegistryClient

    assert is_loopback_host(host) is loopback
    assert RegistryClient(host or "x").scheme == ("http" if loopback and host else "https")


def test_a_release_manifest_the_catalogue_cannot_read_is_refused_before_any_tag_moves(project, run_cli,  # noqa: ANN001
                                                                                       monkeypatch) -> None:
    """The catalogue, written after the tags move, refuses a docs/releases file it cannot read: release asks first,
    so it never stops half done (the registry here is unreachable: reaching it would be another error)."""
    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    (project / "docs/releases").mkdir(parents=True, exist_ok=True)
    (project / "docs/releases/0.0.9.json").write_text("[]")
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--matrix",
                             str(project / "matrix.yaml"))
    assert code == 2 and "docs/releases/0.0.9.json" in err and "unreachable" not in err, err


def test_table_escapes_control_characters_a_note_quotes(capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal quotes what the registry held; an ANSI sequence in it reached the terminal or CI log through the
    table (erasing or recolouring lines)."""
    item = ImageRelease(cell="pytorch-cpu:2.13", image="pytorch-cpu", source="s", release_repo="r",
                        status="refused", problems=["verdict runner \x1b[2K\x1b[1Apromoted\x07"])
    print_report(ReleaseReport("0.1.0", "abc", [item]))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "verdict runner \\x1b[2K\\x1b[1Apromoted\\x07" in out


@pytest.mark.parametrize("args", [["--from", "abc123", "--revision", "def456"], ["--revision=abc123", "--from", "d4"],
                                  ["--from", "abc123", "--from", "def456"]])
def test_from_and_revision_with_two_values_are_refused_naming_both(project, run_cli, args) -> None:  # noqa: ANN001
    """--from and --revision name one option: `--from X --revision Y` promoted Y's images without a word about X.
    Two values are one line naming both now (exit 2); the same value twice is one value."""
    code, out, err = run_cli("release", "--version", "0.1.0", *args, "--matrix", str(project / "matrix.yaml"))
    first, second = (a.partition("=")[0] for a in args if a.startswith("--"))
    values = [a.partition("=")[2] or args[i + 1] for i, a in enumerate(args) if a.startswith("--")]
    assert code == 2 and err.strip() == (f"error: {first} {values[0]!r} and {second} {values[1]!r} name the same "
                                         "option with two values; give one"), err
    assert not (project / "docs/releases").exists()
    code, out, err = run_cli("release", "--version", "x.y", "--from", "abc123", "--revision", "abc123",
                             "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "--version 'x.y' is not a version" in err, err   # past the options, to the first check
