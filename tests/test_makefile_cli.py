"""The Makefile's targets that call the CLI: bad input reaches the user as the CLI's one line and its exit code,
not as a traceback of a later step of the recipe."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SMOKE_", "FRAMEWORK", "REGISTRY"))}
    return subprocess.run(["make", "-s", *args, f"PYTHON={sys.executable}"], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def _own_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("make")]


def test_gpu_smoke_whose_plan_fails_says_the_plans_one_line() -> None:
    """gpu-smoke asks `plan --json` for the dev image: a plan that fails (a bad REGISTRY) stops it with the plan's
    one line and exit 2; its empty output went on to `json.load`, whose traceback followed."""
    proc = _make("gpu-smoke", REGISTRY="not a registry")
    lines = _own_lines(proc.stderr)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: REGISTRY="), proc.stderr


def test_release_passes_a_dispatch_inputs_text_to_the_cli_as_one_argument_not_as_shell(tmp_path: Path) -> None:
    """The release workflow's step (run as GitHub runs it: bash, the dispatch inputs in its environment) ran
    `make release ... FROM="$FROM"` into the recipe's `--from $(FROM)`: `abc; touch FILE` ran `touch` on the release
    runner, and make itself ran a `$(shell ...)` in it. Each input is one argument now, whatever it holds."""
    import json

    import yaml

    from buildtool.render.workflows import RELEASE_PATH

    log, marker = tmp_path / "argv.json", tmp_path / "ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    odd = f"abc'; touch {marker}; echo \"$(touch {marker})\" $(shell touch {marker}) '"
    [step] = [s for s in yaml.safe_load((REPO / RELEASE_PATH).read_text())["jobs"]["release"]["steps"]
              if s.get("name") == "Retag the validated dev images"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK", "REGISTRY", "RELEASE_", "MAKE"))}
    inputs = {"VERSION": "0.1.0", "FRAMEWORK": "pytorch-cpu", "FROM": odd}
    assert set(step["env"]) == set(inputs)
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**base, **inputs, "PYTHON": str(fake)})
    assert proc.returncode == 0 and not marker.exists(), proc.stderr
    assert json.loads(log.read_text()) == ["-m", "buildtool", "release", "--version", "0.1.0", "--framework",
                                           "pytorch-cpu", "--from", odd]


def test_release_without_version_or_from_is_refused_or_promotes_this_commit(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint(sys.argv[1:])\n")
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("VERSION", "FROM", "FRAMEWORK", "RELEASE_REGISTRY")}
    run = functools.partial(subprocess.run, cwd=REPO, capture_output=True, text=True, timeout=60, env=base)
    refused = run(["make", "-s", "release", f"PYTHON={fake}", "VERSION="])
    assert refused.returncode == 2 and "error: set VERSION, e.g. make release VERSION=0.1.0" in refused.stderr
    plain = run(["make", "-s", "release", f"PYTHON={fake}", "VERSION=0.1.0", "FROM="])
    assert plain.stdout.strip() == "['-m', 'buildtool', 'release', '--version', '0.1.0', '--framework', 'all']"


def _recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """(a stand-in PYTHON that appends its arguments to a log as one JSON line and prints nothing, the log)."""
    log, fake = tmp_path / "argv.jsonl", tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + "
                    "'\\n')\n")
    fake.chmod(0o755)
    return fake, log


@pytest.mark.parametrize(("target", "variable", "flag"), [
    ("plan", "FRAMEWORK", "--framework"), ("lock", "FRAMEWORK", "--framework"), ("lock", "PACKAGE", "--package"),
    ("build", "FRAMEWORK", "--framework"), ("build", "PLATFORM", "--platform"), ("push", "FRAMEWORK", "--framework"),
    ("bases", "FRAMEWORK", "--framework"), ("validate", "FRAMEWORK", "--framework"), ("validate", "JOBS", "--jobs"),
    ("validate", "PLATFORM", "--platform"), ("validate", "EXTRA_TESTS", "--extra-tests"),
    ("validate-emulated", "FRAMEWORK", "--framework"), ("validate-emulated", "PLATFORM", "--platform"),
    ("keys", "NAME", "--name"), ("verify", "FRAMEWORK", "--framework"), ("verify", "IMAGE", "verify"),
    ("nightly-validate", "FRAMEWORK", "--framework"), ("nightly-report", "FRAMEWORK", "--framework"),
])
def test_a_value_with_shell_characters_reaches_the_cli_as_one_argument(tmp_path: Path, target: str, variable: str,
                                                                       flag: str) -> None:
    """Only `release` quoted what it spliced into its recipe: `make plan FRAMEWORK="a;touch FILE"` ran `touch`,
    `FRAMEWORK="x'y"` was a shell syntax error and `FRAMEWORK="a b"` a usage error about `b`. Each value is one
    argument of the CLI now (its own check then names what is wrong), and nothing in it runs."""
    fake, log = _recording_python(tmp_path)
    marker = tmp_path / "ran"
    odd = f"a b'; touch {marker}; echo `touch {marker}` \"x\" '"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK", "REGISTRY", "MAKE"))}
    subprocess.run(["make", "-s", target, f"PYTHON={fake}", f"{variable}={odd}", f"NIGHTLY_OUT={tmp_path / 'n'}"],
                   cwd=REPO, env=base, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert not marker.exists()
    if variable == "IMAGE":   # IMAGE is a list of references, one word each (as FRAMEWORK's plan gives them)
        assert [call[call.index(flag) + 1:] for call in calls] == [[word] for word in odd.split()], calls
        return
    assert any(odd in call and call[call.index(odd) - 1] == flag for call in calls), calls


@pytest.mark.parametrize("target", ["validate", "validate-emulated", "nightly-validate"])
def test_every_validate_target_passes_rerun_and_extra_tests(tmp_path: Path, target: str) -> None:
    """`make validate-emulated RERUN=1 EXTRA_TESTS=DIR` ran validate without --rerun (a verdict of the same run was
    reused) and without the site's checks, and nightly-validate dropped EXTRA_TESTS, without a word: the Makefile's
    settings of validate reach each target that runs it now."""
    fake, log = _recording_python(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK", "REGISTRY", "MAKE", "RERUN",
                                                                       "EXTRA_TESTS"))}
    subprocess.run(["make", "-s", target, f"PYTHON={fake}", "RERUN=1", "EXTRA_TESTS=site checks",
                    f"NIGHTLY_OUT={tmp_path / 'n'}"], cwd=REPO, env=base, capture_output=True, text=True, timeout=60)
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert call[:3] == ["-m", "buildtool", "validate"] and "--rerun" in call, call
    assert call[call.index("--extra-tests") + 1] == "site checks", call


def test_verify_image_is_never_globbed(tmp_path: Path) -> None:
    """`make verify IMAGE='*'` ran `verify` once per file name of the checkout: the recipe's `for` loop globbed the
    list. Each word of IMAGE reaches verify as it is written."""
    fake, log = _recording_python(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK", "REGISTRY", "MAKE", "IMAGE"))}
    subprocess.run(["make", "-s", "verify", f"PYTHON={fake}", "IMAGE=* host/x:?"], cwd=REPO, env=base,
                   capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [["-m", "buildtool", "verify", "*"], ["-m", "buildtool", "verify", "host/x:?"]], calls


def test_verify_json_over_several_images_is_one_document(tmp_path: Path) -> None:
    """`make verify FRAMEWORK=... VERIFY_FLAGS=--json` printed each image's document back to back: no JSON reader
    took the whole. It is one array of them now (an image refused with exit 2 printed none), and the exit status is
    still non-zero when any image is not verified."""
    fake = tmp_path / "buildtool"
    fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""\
        import json, sys
        image = sys.argv[2]
        if image == "gone":
            sys.exit("error: the registry does not hold gone")
        print(json.dumps({"image": image, "verified": image == "good"}, indent=2))
        sys.exit(0 if image == "good" else 1)
        """))
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK", "REGISTRY", "MAKE", "IMAGE"))}
    run = functools.partial(subprocess.run, cwd=REPO, env=base, capture_output=True, text=True, timeout=60)
    several = run(["make", "-s", "verify", f"BUILDTOOL={fake}", f"PYTHON={sys.executable}", "IMAGE=good bad gone",
                   "VERIFY_FLAGS=--trust-local-key --json"])
    assert several.returncode != 0 and "error: the registry does not hold gone" in several.stderr, several.stderr
    assert json.loads(several.stdout) == [{"image": "good", "verified": True}, {"image": "bad", "verified": False}]
    good = run(["make", "-s", "verify", f"BUILDTOOL={fake}", f"PYTHON={sys.executable}", "IMAGE=good good",
                "VERIFY_FLAGS=--json"])
    assert good.returncode == 0 and json.loads(good.stdout) == [{"image": "good", "verified": True}] * 2, good.stderr
    text = run(["make", "-s", "verify", f"BUILDTOOL={fake}", f"PYTHON={sys.executable}", "IMAGE=good bad"])
    assert text.returncode != 0 and text.stdout.count('"image"') == 2, text   # without --json: as each prints it
