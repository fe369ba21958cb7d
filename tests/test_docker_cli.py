"""One setting, DOCKER_CLIENT, chooses the docker client of every caller; the setting it replaced
is refused; the client is invoked in one module (buildtool.common.docker_cli).

A fake client (a shell script in tmp_path that logs each command line it is given) stands in for
docker: each caller is shown to run it, and the log is the proof that the setting was the cause.
No engine is needed. The retired setting's name is spelt here (this test and the module are the
only places allowed to), so that these tests read the same before and after the module existed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.imagebuild import engine
from buildtool.launch.scaling import Launcher, run_one
from buildtool.validate import containers as validate_engine
from buildtool.validate import runner
from tests.gpu_sim import FakeGpus, runner_env
from tests.scan import python_sources

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "image-tests"))
import harness  # noqa: E402

RETIRED = "IMAGETEST_DOCKER"
SETTING = "DOCKER_CLIENT"
WORKER = REPO / "bench" / "ddp_epochs.py"
SCALING = {"world_size": 2, "identical": True, "backend": "gloo", "epoch_times_s": [1.0, 0.5], "losses": [1.0, 0.5],
           "peak_memory_mb": [300.0, 301.0]}


def fake_client(folder: Path, body: str = "") -> tuple[Path, Path]:
    """(the fake docker, its log). It has no buildx plugin and says it is 20.10 (so builds use it
    as the classic client), answers `image inspect` and `ps`, writes --iidfile for `build`, and
    prints a scaling result for `run --rm`; `body` runs first (to fail or hang on purpose)."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls.log"
    inspect = json.dumps([{"Id": "sha256:feed", "Os": "linux", "Architecture": "amd64",   # as docker prints them
                           "Config": {"Labels": {"a": "b"}, "Env": ["PATH=/usr/bin"]}}])
    script = f"""#!/bin/bash
# fake docker client (tests/test_docker_cli.py)
printf '%s\\n' "$*" >> {log}
[ -n "$DOCKER_BUILDKIT" ] && echo "env DOCKER_BUILDKIT=$DOCKER_BUILDKIT" >> {log}
{body}
case "$1 $2" in
  "buildx version") exit 1 ;;
  "version --format") echo 20.10.24; exit 0 ;;
  "image inspect") echo '{inspect}'; exit 0 ;;
  "ps -aq") echo "c1 c2"; exit 0 ;;
  "run --rm") echo 'SCALING_RESULT {json.dumps(SCALING)}'; exit 0 ;;
esac
if [ "$1" = build ]; then
  while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && echo sha256:feed > "$2"; shift; done
fi
exit 0
"""
    path = folder / "docker"
    path.write_text(script)
    path.chmod(0o755)
    return path, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(RETIRED, raising=False)
    monkeypatch.delenv(SETTING, raising=False)
    return monkeypatch


@pytest.fixture
def live_containers():
    """The harness's record of containers to remove: restored after a test that starts none."""
    before = set(harness._LIVE)
    yield
    harness._LIVE.intersection_update(before)


# -- one setting, every caller ------------------------------------------------------------------


def test_one_setting_reaches_build_validate_harness_and_scaling(tmp_path, clean_env, live_containers):
    client, log = fake_client(tmp_path / "client")
    clean_env.setenv(SETTING, str(client))

    build = engine.resolve_build_client()
    assert build.argv == (str(client), "build") and dict(build.env) == {"DOCKER_BUILDKIT": "1"}
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    assert engine.build(build, engine.BuildRequest(
        context, context / "Dockerfile", build_args={}, labels={}, secrets={},
                        log_path=tmp_path / "build.log", network_host=False)) == "sha256:feed"
    assert any(c.startswith("build --progress=plain") for c in calls(log))
    assert "env DOCKER_BUILDKIT=1" in calls(log)

    resolved = validate_engine.resolve("t-local:1", print)
    assert (resolved.digest, resolved.labels) == ("sha256:feed", {"a": "b"})
    assert "image inspect t-local:1" in calls(log)
    flags, dropped = runner.probe_flags("t-local:1", ["--shm-size=8g"], print)
    assert flags == ["--shm-size=8g"] and dropped == []
    # The probe's container is labelled (removed by its label if the start hangs): the label is a fresh id.
    probe_run = re.compile(rf"run --rm --network none --entrypoint true --label {re.escape(label_keys.IMAGETEST_RUN)}"
                           r"=probe-[0-9a-f]{12} --shm-size=8g t-local:1")
    assert any(probe_run.fullmatch(c) for c in calls(log)), calls(log)
    validate_engine.remove_run_containers("run1")
    assert any(c.startswith("ps -aq --filter label=") and c.endswith("=run1") for c in calls(log))
    assert "rm -f -v c1 c2" in calls(log)

    container = harness.Container("t-local:1", ["--shm-size=1g"], run_id="run2", out_root=tmp_path, framework=None)
    container.remove()
    assert f"rm -f -v {container.name}" in calls(log)
    assert any(c.startswith(f"run -d --init --name {container.name} ") and c.endswith("t-local:1 sleep infinity")
               for c in calls(log))

    result = run_one(Launcher(kind="docker", image="t-local:1"), 2, WORKER, 256, 2, 64, 60)
    assert result.backend == "gloo" and result.identical
    [launched] = [c for c in calls(log) if c.startswith("run --rm --name=t-scaling-")]
    name = launched.split()[2].split("=", 1)[1]
    assert "torchrun --standalone --nproc-per-node=2" in launched and f"rm -f -v {name}" in calls(log)


def test_gpu_smoke_runs_the_client_the_setting_names(tmp_path):
    """scripts/gpu_smoke.py (standalone: no --docker given) starts its containers with DOCKER_CLIENT."""
    client, log = fake_client(tmp_path / "client")
    env = {**runner_env(tmp_path, FakeGpus(count=2)), SETTING: str(client)}
    env.pop(RETIRED, None)
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke.py"), "--image", "t-local:1", "--out",
                           str(out), "--deadline", "60", "--cell", "pytorch-cuda:2.13"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1 and json.loads(out.read_text())["result"] == "failed", proc.stdout + proc.stderr
    assert "image inspect t-local:1" in calls(log)   # the image and its run flags, probed as validate probes them
    assert any(c.startswith("run --rm --network none --entrypoint true") and "--gpus=all" in c for c in calls(log))
    started = [c for c in calls(log) if c.startswith("run --rm --init --name t-gpu-smoke-")]
    assert started and all("--gpus=all" in c and "t-local:1" in c for c in started), calls(log)


def test_the_autodetected_client_is_the_one_builds_use(tmp_path, clean_env, monkeypatch):
    """Unset: a `docker` on PATH without buildx, 23 or newer (this machine's newer client) loses
    to the classic client, for every command, not only builds."""
    from buildtool.common import docker_cli

    newer, _ = fake_client(tmp_path / "path", 'case "$1 $2" in "version --format") echo 28.2.2; exit 0;; esac')
    classic, log = fake_client(tmp_path / "classic")
    monkeypatch.setenv("PATH", f"{newer.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(docker_cli, "CLASSIC", str(classic))
    assert docker_cli.client() == str(classic)
    assert engine.resolve_build_client().argv == (str(classic), "build")
    validate_engine.resolve("t-local:1", print)
    assert "image inspect t-local:1" in calls(log)

    with_buildx, _ = fake_client(tmp_path / "buildx", 'case "$1 $2" in "buildx version") exit 0;; esac')
    monkeypatch.setenv("PATH", f"{with_buildx.parent}{os.pathsep}{os.environ['PATH']}")
    assert docker_cli.client() == str(with_buildx)
    assert engine.resolve_build_client().argv == (str(with_buildx), "buildx", "build", "--load")


# -- the retired setting is refused, never ignored ----------------------------------------------


def _start_container(tmp_path: Path) -> None:
    harness.Container("t-local:1", [], run_id="r", out_root=tmp_path, framework=None)


CALLERS = {
    "build": lambda tmp_path: engine.resolve_build_client(),
    "validate": lambda tmp_path: validate_engine.resolve("t-local:1", print),
    "validate-cleanup": lambda tmp_path: validate_engine.remove_run_containers("r"),
    "harness": _start_container,
    "scaling": lambda tmp_path: Launcher(kind="docker", image="t-local:1").command(1, WORKER, {}, "t-scaling-x"),
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_the_retired_setting_is_refused_naming_it(caller, tmp_path, clean_env, live_containers):
    """Set beside a good DOCKER_CLIENT too: refused before any docker command ran."""
    client, log = fake_client(tmp_path / "client")
    clean_env.setenv(SETTING, str(client))
    clean_env.setenv(RETIRED, str(client))
    with pytest.raises(UserError) as caught:
        CALLERS[caller](tmp_path)
    message = str(caught.value)
    assert RETIRED in message and SETTING in message and "\n" not in message, message
    assert [c for c in calls(log) if not c.startswith(("buildx version", "version"))] == []


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


@pytest.mark.parametrize("command", [
    _python("-m", "buildtool", "validate", "t-local:1", "--no-store"),
    _python(str(REPO / "scripts" / "gpu_smoke.py"), "--image", "t-local:1", "--out", "OUT"),
    _python(str(REPO / "scripts" / "gpu_smoke.py"), "--python", sys.executable, "--out", "OUT"),
    _python("-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", str(REPO / "image-tests" / "common")),
], ids=["buildtool-validate", "gpu-smoke-image", "gpu-smoke-python", "image-tests-session"])
def test_the_retired_setting_stops_each_command_with_one_line(command, tmp_path):
    env = {**os.environ, RETIRED: "/usr/bin/docker"}
    env.pop(SETTING, None)
    argv = [str(tmp_path / "out.json") if a == "OUT" else a for a in command]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if RETIRED in line]
    assert proc.returncode == 2 and len(said) == 1 and SETTING in said[0], proc.stdout + proc.stderr
    assert not (tmp_path / "out.json").exists()


# -- what a wrong setting, a lost engine or a slow command says ---------------------------------


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_missing_client_is_one_line_naming_the_setting(caller, tmp_path, clean_env, live_containers):
    clean_env.setenv(SETTING, str(tmp_path / "no-such-docker"))
    with pytest.raises(UserError) as caught:
        CALLERS[caller](tmp_path)
    message = str(caught.value)
    assert SETTING in message and "no-such-docker" in message and "\n" not in message, message


def test_classic_without_debians_client_names_the_setting(tmp_path, clean_env, monkeypatch):
    from buildtool.common import docker_cli

    monkeypatch.setattr(docker_cli, "CLASSIC", str(tmp_path / "usr-bin-docker"))
    clean_env.setenv(SETTING, "classic")
    with pytest.raises(UserError, match=f"{SETTING}=classic .*usr-bin-docker.*scripts/setup.sh"):
        docker_cli.client()


def test_an_unreachable_engine_says_how_to_start_it(tmp_path, clean_env):
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", 'echo "Cannot connect to the Docker daemon at '
                            'unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1')
    clean_env.setenv(SETTING, str(client))
    for caller in (lambda: validate_engine.resolve("t-local:1", print),
                   lambda: run_one(Launcher(kind="docker", image="t-local:1"), 1, WORKER, 256, 2, 64, 60)):
        with pytest.raises(docker_cli.EngineUnreachable) as caught:
            caller()
        message = str(caught.value)
        assert "start it (bash scripts/setup.sh)" in message and "Cannot connect" in message and "\n" not in message


def test_a_command_past_its_timeout_names_the_subcommand(tmp_path, clean_env):
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", "exec sleep 30")
    clean_env.setenv(SETTING, str(client))
    with pytest.raises(docker_cli.DockerTimeout) as caught:
        docker_cli.docker("image", "inspect", "--format", "{{.Id}}", "t-local:1", timeout=0.2)
    assert str(caught.value).startswith("`docker image inspect` did not finish within 0.2 s")
    assert isinstance(caught.value, subprocess.TimeoutExpired) and isinstance(caught.value, UserError)
    with pytest.raises(subprocess.TimeoutExpired):   # what the harness catches to kill a probe's supervisor
        harness._docker("exec", "-e", "A=1", "c", "true", timeout=0.2)


def test_the_module_runs_on_the_gpu_runners_python() -> None:
    """gpu_smoke imports it with any Python 3.9+: standard library only, 3.9 syntax."""
    for path in (REPO / "buildtool" / "common" / "docker_cli.py", REPO / "buildtool" / "common" / "errors.py"):
        tree = ast.parse(path.read_text(), feature_version=(3, 9))
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert {m.split(".")[0] for m in imported} <= set(sys.stdlib_module_names) | {"__future__", "buildtool"}
    proc = subprocess.run([sys.executable, "-I", "-S", str(REPO / "scripts" / "gpu_smoke.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "DOCKER_CLIENT" in proc.stdout, proc.stderr


# -- no other way to choose or start the client -------------------------------------------------

MODULE = Path("buildtool/common/docker_cli.py")
THIS = Path("tests/test_docker_cli.py")
SCANNED = ("buildtool", "image-tests", "scripts", "bench", "tests")
DOCUMENTS = ("README.md", "Makefile", "docs", "image-tests/README.md", ".ci", ".github", "scripts")


def _names_docker(node: ast.AST) -> bool:
    """A literal that names a docker binary: "docker", "/usr/bin/docker"."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        (node.value == "docker" or node.value.endswith("/docker"))


def _a_client_constant(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "DOCKER") or \
        (isinstance(node, ast.Attribute) and node.attr == "DOCKER")


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _choices(rel: Path, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):   # code, strings and comments alike
        if RETIRED in line:
            found.append(f"{rel}:{number}: {RETIRED} (set {SETTING}; read it through docker_cli)")
    for node in ast.walk(ast.parse(text)):
        what = ""
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if _names_docker(first) or _a_client_constant(first):
                what = f"a docker command line of its own: [{ast.unparse(first)}, ...]"
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            default = [k.value for k in node.keywords if k.arg == "default"]
            if (name in ("which", "get", "getenv") and any(_names_docker(a) for a in node.args)) or \
                    any(_names_docker(d) for d in default):
                what = f"a docker client chosen here: {ast.unparse(node)[:60]}"
            elif node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and node.args[0].value.startswith("docker ") and name in ("run", "Popen", "system", "check_output"):
                what = f"a docker command line of its own: {node.args[0].value[:40]!r}"
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and _names_docker(node.value):
            what = f"a docker client chosen here: {ast.unparse(node)[:60]}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and \
                any(_names_docker(d) for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None):
            what = "a docker client as a default argument"
        if what:
            found.append(f"{rel}:{getattr(node, 'lineno', 0)}: {what}")
    return found


def client_choices(root: Path) -> list[str]:
    """Every place outside docker_cli (and this test) that reads the retired setting or picks and
    starts a docker client itself."""
    found: list[str] = []
    for rel, text in python_sources(root, SCANNED, (MODULE, THIS)):
        found += _choices(rel, text)
    return found


def retired_mentions(root: Path) -> list[str]:
    """Documents, the Makefile, CI and shell scripts that still name the retired setting."""
    found = []
    for top in DOCUMENTS:
        base = root / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for path in paths:
            if path.suffix == ".py" or ".venv" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if RETIRED in line:
                    found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_other_module_chooses_or_starts_the_docker_client() -> None:
    found = client_choices(REPO)
    assert found == [], "use buildtool.common.docker_cli (docker, argv, client, remove):\n" + "\n".join(found)


def test_no_document_names_the_retired_setting() -> None:
    found = retired_mentions(REPO)
    assert found == [], f"{RETIRED} is retired; write {SETTING}:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "expected"), [
    (f'DOCKER = os.environ["{RETIRED}"]\n', f"a.py:1: {RETIRED}"),
    ('import os\nclient = os.environ.get("X", "docker")\n', "a.py:2: a docker client chosen here"),
    ('subprocess.run(["docker", "ps"], timeout=5)\n', "a.py:1: a docker command line of its own: ['docker'"),
    ('subprocess.run(["/usr/bin/docker", "rmi", ref])\n', "a.py:1: a docker command line of its own"),
    ('subprocess.run([DOCKER, "rm", name])\n', "a.py:1: a docker command line of its own: [DOCKER"),
    ('subprocess.run([fixture_images.DOCKER, *args])\n', "a.py:1: a docker command line of its own"),
    ('cmd = ("docker", "run")\n', "a.py:1: a docker command line of its own"),
    ('path = shutil.which("docker")\n', "a.py:1: a docker client chosen here: shutil.which('docker')"),
    ('@dataclass\nclass L:\n    docker: str = "docker"\n', "a.py:3: a docker client chosen here"),
    ('def f(docker="/usr/bin/docker"):\n    pass\n', "a.py:1: a docker client as a default argument"),
    ('ap.add_argument("--docker", default="docker")\n', "a.py:1: a docker client chosen here"),
    ('subprocess.run("docker ps -q", shell=True)\n', "a.py:1: a docker command line of its own"),
    (f"# set {RETIRED} to the shim\n", f"a.py:1: {RETIRED}"),
])
def test_the_scan_finds_each_way_of_choosing_a_client(source: str, expected: str, tmp_path: Path) -> None:
    """The negative control: each way, planted in a file of its own, is found and placed."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "a.py").write_text(source)
    found = client_choices(tmp_path)
    assert len(found) == 1 and found[0].startswith(f"scripts/{expected}"), found


def test_what_is_not_choosing_a_client_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "buildtool").mkdir()
    (tmp_path / "buildtool" / "ok.py").write_text(
        'kind = "docker" if image else "host"\nif kind == "docker":\n    pass\n'
        'Launcher(kind="docker", image="i")\nkey = {"client": "docker"}\nfake = tmp / "docker"\n'
        'cmd = docker_cli.argv("run", image)\nrun_cli("slurm", "--runtime", "docker")\n')
    assert client_choices(tmp_path) == []


def test_a_document_naming_the_retired_setting_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"set {SETTING}\nor {RETIRED}=/usr/bin/docker\n")
    (tmp_path / "Makefile").write_text(f"export {RETIRED}\n")
    assert retired_mentions(tmp_path) == ["Makefile:1", "docs/a.md:2"]


# -- one way to inspect an image ----------------------------------------------------------------


def test_every_inspection_runs_the_chosen_client_and_reads_the_same_object(tmp_path, clean_env):
    """The builder (engine.image_attrs), validate and the package probe inspect through docker_cli.inspect_image:
    the fake client's log holds each one's `image inspect`, and all read its one object."""
    from buildtool.imagebuild import image_probe

    client, log = fake_client(tmp_path / "client")
    clean_env.setenv(SETTING, str(client))
    attrs = engine.image_attrs("t-build:1")
    assert attrs is not None and attrs["Id"] == "sha256:feed" and engine.image_labels("t-build:1") == {"a": "b"}
    assert image_probe.local_image("t-probe:1") == ("sha256:feed", ["PATH=/usr/bin"])
    assert validate_engine.inspect_image("t-validate:1") == attrs
    for ref in ("t-build:1", "t-probe:1", "t-validate:1"):
        assert f"image inspect {ref}" in calls(log)


@pytest.mark.parametrize("said", ["Error: No such image: t-gone:1",                          # docker 24+
                                  "Error response from daemon: No such image: t-gone:1",     # docker 20.10
                                  "Error: t-gone:1: image not known"])                       # podman
def test_a_missing_image_is_none(said, tmp_path, clean_env):
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", f'[ "$1 $2" = "image inspect" ] && {{ echo "{said}" >&2; exit 1; }}')
    clean_env.setenv(SETTING, str(client))
    assert docker_cli.inspect_image("t-gone:1") is None
    assert engine.image_attrs("t-gone:1") is None


def test_an_engine_that_fails_otherwise_is_an_error_not_a_missing_image(tmp_path, clean_env):
    """Taking any failure for "no such image" would make the builder rebuild, and validate pull, on an engine
    that is out of disk or refusing the client: it is an error naming the engine's words."""
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", '[ "$1 $2" = "image inspect" ] && { echo "Error response from '
                            'daemon: client version 1.52 is too new. Maximum supported API version is 1.41" >&2; '
                            'exit 1; }')
    clean_env.setenv(SETTING, str(client))
    with pytest.raises(docker_cli.DockerError, match="cannot inspect t-local:1: .*client version 1.52 is too new"):
        docker_cli.inspect_image("t-local:1")
    with pytest.raises(docker_cli.DockerError):
        engine.image_attrs("t-local:1")


@pytest.mark.parametrize("printed", ["WARNING: the client config is world-readable", "{}", "[]"])
def test_a_client_that_prints_no_image_and_exits_0_is_the_one_line_error(printed, tmp_path, clean_env):
    """Output that is not one image object (not JSON at all: a warning on stdout) is the DockerError, not a
    JSONDecodeError traceback."""
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", f'[ "$1 $2" = "image inspect" ] && {{ echo "{printed}"; exit 0; }}')
    clean_env.setenv(SETTING, str(client))
    with pytest.raises(docker_cli.DockerError, match="^cannot inspect t-odd:1: the docker client printed no single "
                                                     "image$"):
        docker_cli.inspect_image("t-odd:1")


# -- clean-up that cannot list or remove containers says so ------------------------------------


PS_FAILS = '[ "$1" = ps ] && { echo "Error response from daemon: x" >&2; exit 1; }'


def test_a_failed_docker_ps_in_clean_up_is_reported_not_taken_for_nothing_to_remove(tmp_path, clean_env):
    """remove_labelled returned [] when `docker ps` failed, so every clean-up silently left the run's containers.
    Now it is one line naming the label; in a clean-up after another error it is a warning, and that error stays."""
    from buildtool.common import docker_cli
    from buildtool.contracts import label_keys
    from buildtool.validate import network

    client, log = fake_client(tmp_path / "client", PS_FAILS)
    clean_env.setenv(SETTING, str(client))
    said = ("cannot list the containers labelled k=v (`docker ps`: Error response from daemon: x); containers "
            "labelled k=v may be left: remove them with `docker rm -f -v $(docker ps -aq --filter label=k=v)`")
    with pytest.raises(docker_cli.DockerError) as caught:
        docker_cli.remove_labelled("k", "v")
    assert str(caught.value) == said and type(caught.value).__name__ == "LeftBehind"
    label = f"{label_keys.IMAGETEST_RUN}=r1"
    with pytest.raises(docker_cli.DockerError, match=f"cannot list the containers labelled {label} "):
        validate_engine.remove_run_containers("r1")
    warnings: list[str] = []
    validate_engine.remove_run_containers("r1", warnings.append)
    with pytest.raises(RuntimeError, match="^the run's own error$"), network.run_network("r1", warnings.append):
        raise RuntimeError("the run's own error")
    assert warnings == [f"warning: cannot list the containers labelled {label} (`docker ps`: Error response from "
                        f"daemon: x); containers labelled {label} may be left: remove them with "
                        f"`docker rm -f -v $(docker ps -aq --filter label={label})`"] * 2
    assert f"network rm {network.name_for('r1')}" in calls(log)


def test_a_container_docker_rm_cannot_remove_is_reported_one_gone_meanwhile_is_not(tmp_path, clean_env):
    from buildtool.common import docker_cli

    gone, _ = fake_client(tmp_path / "gone", '[ "$1" = rm ] && { echo "Error: No such container: c2" >&2; exit 1; }')
    clean_env.setenv(SETTING, str(gone))
    assert docker_cli.remove_labelled("k", "v") == ["c1", "c2"]
    stuck, _ = fake_client(tmp_path / "stuck", '[ "$1" = rm ] && { echo "Error response from daemon: cannot remove '
                                               'container c1: device or resource busy" >&2; exit 1; }')
    clean_env.setenv(SETTING, str(stuck))
    with pytest.raises(docker_cli.DockerError, match=r"^cannot remove the containers labelled k=v \(`docker rm`: Error "
                                                    r"response from daemon: cannot remove container c1: device or "
                                                    r"resource busy\); containers labelled k=v may be left"):
        docker_cli.remove_labelled("k", "v")


def test_output_that_is_not_utf8_is_read_not_a_traceback(tmp_path, clean_env, run_cli):
    """docker() decoded the client's output strictly: a byte that is not UTF-8 (an image's file name, a program's
    output in a container) was a UnicodeDecodeError traceback out of `buildtool diff` of a local image. It is read
    with the byte replaced now, and diff says in one line that the listing is not one."""
    from buildtool.common import docker_cli

    client, _ = fake_client(tmp_path / "client", """[ "$1" = run ] && { printf 'caf\\xe9\\n'; exit 0; }""")
    clean_env.setenv(SETTING, str(client))
    assert docker_cli.docker("run", "--rm", "t-local:1", timeout=10).stdout == "caf\ufffd\n"
    code, out, err = run_cli("diff", "t-local:1", "t-local:2")
    assert code == 1 and "Traceback" not in err and "cannot list the packages of t-local:1" in err, err


@pytest.mark.parametrize("cut", ["timeout", "ctrl-c"])
def test_a_network_create_cut_short_has_its_network_removed(tmp_path, clean_env, cut):
    """`docker network create` past its timeout (or Ctrl-C, CI's cancel) may leave the network the engine made: the
    run's `try` that removes it began only after the create answered, so that network stayed until a later validate
    swept it, after this process ended. Now the run's network is removed whichever way its creation ended."""
    import signal

    from buildtool.common.docker_cli import DockerTimeout
    from buildtool.validate import network

    client, log = fake_client(tmp_path / "client", '[ "$1 $2" = "network create" ] && exec sleep 30')
    clean_env.setenv(SETTING, str(client))
    clean_env.setattr(network, "TIMEOUT_S", 1 if cut == "timeout" else 60)

    def ctrl_c(*_args: object) -> None:
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0 if cut == "timeout" else 1.0)
    try:
        with pytest.raises(DockerTimeout if cut == "timeout" else KeyboardInterrupt), network.run_network("r1", print):
            raise AssertionError("the block never runs: the network was not made")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert calls(log)[-1] == f"network rm {network.name_for('r1')}", calls(log)
