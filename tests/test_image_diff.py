"""`buildtool diff` without an engine: packages listed removed, then changed, then added (each group
by scope and name), and an image without an SBOM probed through the docker client DOCKER_CLIENT
names. The registry is patched (manifest digests, the SBOM found or not); the client is a fake
(a shell script that logs its command lines and answers as the engine would), so the log shows the
throw-away container, its options and its removal, on success, failure and timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.registry.client import RegistryClient
from buildtool.sbom import document as sbom
from buildtool.sbom import signing as _signing  # noqa: F401  imported before the fixture patches sbom.load_sbom (below)

REG = "r.example:5000"
DIGESTS = {"old": "sha256:" + "1" * 64, "new": "sha256:" + "2" * 64, "base": "sha256:" + "3" * 64}
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "base": "debian@sha256:9"}
PROBE = {"python": "3.11.2", "os": "Debian GNU/Linux 12 (bookworm)",
         "python_packages": {"numpy": "2.4.6", "torch": "2.13.0+cpu", "torch-tb-profiler": "0.4.3", "zstd": "1.0"},
         "apt_packages": {"bash": "5.2.15-2+b13", "python3.11": "3.11.2-6+deb12u6", "libc6": "2.36-9"}}


def _changed_probe() -> dict:
    probe = json.loads(json.dumps(PROBE))
    del probe["python_packages"]["torch-tb-profiler"]      # removed
    del probe["python_packages"]["zstd"]                   # removed
    probe["python_packages"]["numpy"] = "2.5.0"            # changed
    probe["python_packages"]["aiohttp"] = "3.0"            # added, sorts before everything
    probe["python_packages"]["pillow"] = "13.0.0"          # added
    probe["apt_packages"]["python3.11"] = "3.11.2-6+deb12u7"   # changed
    probe["apt_packages"]["curl"] = "7.88"                 # added
    del probe["apt_packages"]["bash"]                      # removed
    return probe


def _document(probe: dict, digest: str, facts: dict[str, str]) -> dict:
    """A CycloneDX document as sbom.contents reads one: the root's facts, pypi and deb purls."""
    from packageurl import PackageURL

    root = {"properties": [{"name": f"{sbom.PROPERTY}:{k}", "value": v} for k, v in sorted(facts.items())]}
    components = [{"purl": PackageURL("pypi", name=n, version=v).to_string()}
                  for n, v in probe["python_packages"].items()]
    components += [{"purl": PackageURL("deb", namespace="debian", name=n, version=v,
                                       qualifiers={"arch": "amd64"}).to_string()}
                   for n, v in probe["apt_packages"].items()]
    return {"bomFormat": "CycloneDX", "metadata": {"component": {"name": "img", "version": digest, **root}},
            "components": components}


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict | None]:
    """Tags old/new/base of REG/img; `documents[tag]` is the SBOM attached to its digest (None: none)."""
    documents: dict[str, dict | None] = {
        "old": _document(PROBE, DIGESTS["old"], FACTS),
        "new": _document(_changed_probe(), DIGESTS["new"], FACTS),
        "base": None,
    }
    by_digest = {DIGESTS[tag]: tag for tag in DIGESTS}

    def manifest_digest(self: RegistryClient, repo: str, ref: str) -> str | None:
        return DIGESTS.get(ref) or (ref if ref in by_digest else None)

    def load_sbom(client: RegistryClient, repo: str, digest: str) -> tuple[dict, str] | None:
        document = documents[by_digest[digest]]
        return None if document is None else (document, "sha256:" + "a" * 64)

    monkeypatch.setattr(RegistryClient, "manifest_digest", manifest_digest)
    # sbom.signing binds load_sbom when imported (`from ... import`): imported while this stand-in is in place, it
    # kept it for good, and the SBOM readers' tests that ran after these read it (hence the import above).
    monkeypatch.setattr(sbom, "load_sbom", load_sbom)
    # diff reads the signed SBOM (tests/test_sbom_signed_reader.py checks the signature and the plain one).
    monkeypatch.setattr("buildtool.imagebuild.image_diff.read_signed_sbom",
                        lambda client, repo, digest, trusted: load_sbom(client, repo, digest))
    return documents


def test_packages_are_listed_removed_then_changed_then_added(registry, run_cli):
    code, out, err = run_cli("diff", f"{REG}/img:old", f"{REG}/img:new")
    assert code == 0, err
    assert out.splitlines() == [
        "removed torch-tb-profiler (python) 0.4.3",
        "removed zstd (python) 1.0",
        "removed bash (apt) 5.2.15-2+b13",
        "numpy (python): 2.4.6 -> 2.5.0",
        "python3.11 (apt): 3.11.2-6+deb12u6 -> 3.11.2-6+deb12u7",
        "added aiohttp (python) 3.0",
        "added pillow (python) 13.0.0",
        "added curl (apt) 7.88",
    ]
    assert "3 removed, 2 changed, 3 added packages" in err


def test_json_lists_the_same_order_and_where_each_side_came_from(registry, run_cli):
    code, out, err = run_cli("diff", "--json", f"{REG}/img:old", f"{REG}/img:new")
    assert code == 0, err
    found = json.loads(out)
    assert [(c["kind"], c["name"]) for c in found["changes"]] == [
        ("removed", "torch-tb-profiler"), ("removed", "zstd"), ("removed", "bash"), ("changed", "numpy"),
        ("changed", "python3.11"), ("added", "aiohttp"), ("added", "pillow"), ("added", "curl")]
    assert found["before"] == {"image": f"{REG}/img:old", "digest": DIGESTS["old"], "source": "sbom",
                               "sbom": "sha256:" + "a" * 64, "image_id": None, "python_environments": None}
    assert found["after"]["source"] == "sbom" and found["after"]["digest"] == DIGESTS["new"]


def test_headline_facts_stay_first(registry, run_cli):
    registry["new"] = _document(_changed_probe(), DIGESTS["new"],
                                dict(FACTS, python="3.11.3", framework="pytorch 2.13.1+cpu"))
    code, out, err = run_cli("diff", f"{REG}/img:old", f"{REG}/img:new")
    assert code == 0, err
    assert out.splitlines()[:3] == ["framework: pytorch 2.13.0+cpu -> pytorch 2.13.1+cpu", "python: 3.11.2 -> 3.11.3",
                                    "removed torch-tb-profiler (python) 0.4.3"]


# -- probing ------------------------------------------------------------------------------------

def _env(python: str, version: str, packages: dict[str, str]) -> str:
    return f"@@python {python}\n" + json.dumps({"python": version, "python_packages": packages}) + "\n"


DEBIAN_ONLY = ("@@os \"Debian GNU/Linux 12 (bookworm)\"\n@@apt\n"
               "ii \tbash\t5.2.15-2+b13\nii \tlibc6\t2.36-9\nrc \tgone\t1.0\n@@end\n")


def fake_client(folder: Path, run_output: str = DEBIAN_ONLY, *, local: bool = False, pull: str = "",
                run: str = "") -> tuple[Path, Path]:
    """(the fake docker, its log). `image inspect` answers once the image is local (or pulled);
    `pull` exits 1 with `pull` as its stderr when set; `run` replaces what `run` does (default:
    print run_output)."""
    folder.mkdir(parents=True, exist_ok=True)
    log, state, output = folder / "calls.log", folder / "pulled", folder / "run-output.txt"
    output.write_text(run_output)
    if local:
        state.touch()
    script = f"""#!/bin/bash
printf '%s ' "${{@:1:12}}" >> {log}; echo >> {log}
case "$1" in
  image)
    [ -e {state} ] || {{ echo "Error: No such image: $3" >&2; exit 1; }}
    echo '[{{"Id": "sha256:feed", "Config": {{"Env": ["PATH=/usr/bin","CUDA_VERSION=12.8"]}}}}]'; exit 0 ;;
  pull)
    {f'echo "{pull}" >&2; exit 1' if pull else f'touch {state}; exit 0'} ;;
  run)
    {run or f'cat {output}; exit 0'} ;;
  rm) exit 0 ;;
esac
exit 3
"""
    fake = folder / "docker"
    fake.write_text(script)
    fake.chmod(0o755)
    return fake, log


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


def test_an_image_without_sbom_is_pulled_probed_in_a_container_without_network_and_removed(
        registry, run_cli, tmp_path, monkeypatch):
    fake, log = fake_client(tmp_path)
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    code, out, err = run_cli("diff", f"{REG}/img:base", f"{REG}/img:old")
    assert code == 0, err
    assert (f"before: {REG}/img:base: no SBOM attached, probed image sha256:feed: 0 Python and 2 Debian packages; "
            "Python environments: none (Debian packages only)") in err
    assert f"after: {REG}/img:old: SBOM sha256:{'a' * 64} of {DIGESTS['old']}: 4 Python and 3 Debian" in err
    lines = out.splitlines()
    # A probe sees Python, OS and CUDA; the framework and base it cannot see are not "added".
    assert lines[:3] == ["added python 3.11.2", "removed cuda 12.8", "removed os Debian GNU/Linux 12 (bookworm)"]
    assert not [line for line in lines if "framework" in line or "base" in line]
    # libc6 (dpkg's ${Package}, as deb purls name it) and bash are the same: no removed or changed package.
    assert [line for line in lines if " (python) " in line or " (apt) " in line] == [
        "added numpy (python) 2.4.6", "added torch (python) 2.13.0+cpu", "added torch-tb-profiler (python) 0.4.3",
        "added zstd (python) 1.0", "added python3.11 (apt) 3.11.2-6+deb12u6"]
    calls = _calls(log)
    pinned = f"{REG}/img@{DIGESTS['base']}"
    assert calls[:3] == [f"image inspect {pinned} ",
                         f"pull {pinned} ",
                         f"image inspect {pinned} "]
    run, rm = calls[3].split(), calls[4].split()
    name = run[3]
    assert run[:3] == ["run", "--rm", "--name"] and name.startswith("dl-images-probe-")
    assert run[4:11] == ["--network", "none", "--pull", "never", "--entrypoint", "/bin/sh", "sha256:feed"]
    assert rm == ["rm", "-f", "-v", name]


def test_every_python_environment_is_listed_and_merged_first_wins(registry, run_cli, tmp_path, monkeypatch):
    output = DEBIAN_ONLY.replace("@@end\n", "") + _env("/opt/venv/bin/python", "3.11.2", {"torch": "2.13.0+cpu"}) \
        + _env("/usr/bin/python3", "3.11.2", {"torch": "1.0", "six": "1.16"}) + "@@end\n"
    fake, _ = fake_client(tmp_path, output, local=True)
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    code, out, err = run_cli("diff", "--json", "local/image:1", f"{REG}/img:old")
    assert code == 0, err
    before = json.loads(out)["before"]
    assert before == {"image": "local/image:1", "digest": None, "source": "probe", "sbom": None,
                      "image_id": "sha256:feed",
                      "python_environments": [{"python": "/opt/venv/bin/python", "version": "3.11.2", "packages": 1},
                                              {"python": "/usr/bin/python3", "version": "3.11.2", "packages": 2}]}
    changes = {(c["kind"], c["name"]): (c["before"], c["after"]) for c in json.loads(out)["changes"]}
    assert changes[("removed", "six")] == ("1.16", None)          # only in the system python3
    assert ("changed", "torch") not in changes                    # the venv's torch wins, as `python` imports it
    assert changes[("removed", "cuda")] == ("12.8", None)         # the image's CUDA_VERSION
    code, _, err = run_cli("diff", "local/image:1", f"{REG}/img:old")
    assert code == 0 and ("before: local/image:1: named without a registry, probed image sha256:feed: 2 Python and 2 "
                          "Debian packages; Python environments: /opt/venv/bin/python (3.11.2, 1), "
                          "/usr/bin/python3 (3.11.2, 2)") in err


def test_an_image_that_cannot_be_pulled_is_exit_1_naming_it(registry, run_cli, tmp_path, monkeypatch):
    fake, log = fake_client(tmp_path, pull="Error response from daemon: manifest for nosuch/image:1 not found")
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    code, out, err = run_cli("diff", "nosuch/image:1", f"{REG}/img:old")
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == ("failed: cannot pull nosuch/image:1: Error response from daemon: "
                                            "manifest for nosuch/image:1 not found")
    assert not any(call.startswith("run ") for call in _calls(log))


def test_an_image_that_cannot_run_is_exit_1_and_its_container_removed(registry, run_cli, tmp_path, monkeypatch):
    said = ('docker: Error response from daemon: failed to create shim task: OCI runtime create failed: '
            'exec: "/bin/sh": stat /bin/sh: no such file or directory: unknown.')
    fake, log = fake_client(tmp_path, local=True, run=f"echo '{said}' >&2; exit 127")
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    code, _, err = run_cli("diff", "distroless/x:1", f"{REG}/img:old")
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("failed: cannot run distroless/x:1 to list its packages: docker: Error response")
    assert "stat /bin/sh: no such file" in last
    calls = _calls(log)
    assert calls[-1] == f"rm -f -v {calls[-2].split()[3]} "


def test_a_probe_past_its_timeout_is_exit_1_and_its_container_removed(registry, run_cli, tmp_path, monkeypatch):
    fake, log = fake_client(tmp_path, local=True, run="exec sleep 30")
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    code, _, err = run_cli("diff", "--probe-timeout", "1", "slow/x:1", f"{REG}/img:old")
    assert code == 1
    assert err.strip().splitlines()[-1] == ("failed: cannot probe slow/x:1: its package listing did not finish "
                                            "within 1 s")
    calls = _calls(log)
    assert calls[-2].startswith("run --rm --name dl-images-probe-")
    assert calls[-1] == f"rm -f -v {calls[-2].split()[3]} "


@pytest.mark.parametrize(("output", "message"), [
    (DEBIAN_ONLY.replace("@@end\n", "@@fail dpkg-query exited 2\n@@end\n"), "dpkg-query exited 2"),
    ("@@os x\n@@apt\nii \tbash\t5\n", "the probe's output is incomplete"),
    ("@@os x\n@@python /usr/bin/python\nTraceback (most recent call last)\n@@end\n",
     "/usr/bin/python printed no package listing (Traceback (most recent call last))"),
])
def test_a_listing_that_failed_or_stopped_names_the_image_and_the_cause(output, message):
    from buildtool.common.errors import FailedError
    from buildtool.imagebuild.image_probe import parse

    with pytest.raises(FailedError, match="cannot list the packages of img:1: ") as caught:
        parse("img:1", "sha256:feed", output)
    assert message in str(caught.value)


def test_sbom_and_diff_json_print_the_documents_text_as_it_is(registry, run_cli, monkeypatch):
    """`sbom` and `diff --json` printed their JSON through rich, which reads `:name:` as an emoji code even with
    markup off: a value holding `:ok:` or `:x:` came out as 🆗 or ❌, so the SBOM on stdout was not the attached one.
    The JSON is written as json.dumps made it now."""
    registry["new"] = _document(_changed_probe(), DIGESTS["new"], dict(FACTS, framework="x:ok:y :x: z"))
    document = registry["new"]
    monkeypatch.setattr("buildtool.sbom.signing.read_signed_sbom",
                        lambda client, repo, digest, trusted: (document, "sha256:" + "a" * 64))
    code, out, err = run_cli("sbom", f"{REG}/img:new")
    assert code == 0, err
    assert out == json.dumps(document, indent=1, sort_keys=True) + "\n"
    code, out, err = run_cli("diff", "--json", f"{REG}/img:old", f"{REG}/img:new")
    assert code == 0, err
    assert "x:ok:y :x: z" in out and json.loads(out)["changes"][0]["after"] == "x:ok:y :x: z"


def test_an_unreachable_registry_is_exit_2_as_for_sbom_and_verify(run_cli, no_registry_backoff) -> None:  # noqa: ANN001
    """diff said exit 1 ("failed") where sbom and verify, reading the same registry, say exit 2 (the address is
    wrong or nothing answers there: RegistryUnreachable is bad input)."""
    codes = {}
    for args in (("diff", "127.0.0.1:1/a:1", "127.0.0.1:1/b:1"), ("sbom", "127.0.0.1:1/a:1")):
        code, _, err = run_cli(*args)
        codes[args[0]] = code
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert codes == {"diff": 2, "sbom": 2}, codes


def test_the_diff_probe_lists_held_packages_as_installed():
    """An installed package on hold (dpkg status `hi `, apt-mark hold) was left out of the probed apt list, so a diff
    against an SBOM (which lists it) showed it removed."""
    from buildtool.imagebuild.image_probe import parse

    found = parse("x", "sha256:" + "a" * 64, "@@os x\n@@apt\nhi \tlibcudnn9\t9.1-1\nrc \tgone\t1.0\n@@end\n")
    assert found.apt == {"libcudnn9": "9.1-1"}


def test_the_diff_probe_keeps_multi_arch_pairs_apart_as_the_sbom_does():
    """The probe listed dpkg's Package without its architecture: libc6 for amd64 and for i386 became one entry (the
    last listed), where the SBOM's contents keep them apart as libc6:amd64 and libc6:i386."""
    from buildtool.imagebuild.image_probe import parse

    found = parse("x", "sha256:" + "a" * 64, "@@os x\n@@apt\nii \tlibc6\t2.36-9\tamd64\nii \tlibc6\t2.36-10\ti386\n"
                                             "ii \tbash\t5.2\tamd64\n@@end\n")
    assert found.apt == {"bash": "5.2", "libc6:amd64": "2.36-9", "libc6:i386": "2.36-10"}


@pytest.mark.parametrize("line", ["ii \tlibc6", "ii ", "ii \t\t2.36-9\tamd64", "ii \tlibc6\t\tamd64",
                                  "ii \tlibc6\t2.36-9\tamd64\textra"])
def test_a_garbled_dpkg_line_in_the_probe_is_an_error_naming_it(line):
    """A dpkg-query line cut short or garbled (no version, no name, a field too many) was padded with empty fields
    and recorded: `libc6` with version '' or a package named '', so the diff showed a change that no image had."""
    from buildtool.imagebuild.image_probe import FailedError, parse

    with pytest.raises(FailedError) as caught:
        parse("reg/x:1", "sha256:" + "a" * 64, f"@@os x\n@@apt\nii \tbash\t5.2\tamd64\n{line}\n@@end\n")
    assert str(caught.value) == f"cannot list the packages of reg/x:1: dpkg-query printed {line!r}, not its " \
                                "status, package, version and architecture"
