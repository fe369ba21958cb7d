"""A GPU runner, simulated: a fake `nvidia-smi` first on PATH and a Docker engine shim.

Nothing here has a GPU. The fake nvidia-smi answers the queries validate makes
(`--query-gpu=...`, the plain header with "CUDA Version", `-L`) as a runner with GPUs would,
or fails as nvidia-smi does after a driver/NVML mismatch. The engine shim (DOCKER_CLIENT points at
it, so validation, the image tests, builds and gpu_smoke all go through it) passes every command
to the real client, except `--gpus`, which it refuses with Docker's own message for an engine
without the NVIDIA Container Toolkit, or silently drops (an engine that starts the container
without its GPUs).
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from buildtool.common import docker_cli

# Docker 20.10's message when no runtime can provide GPUs.
NO_RUNTIME = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
# The same refusal as a newer client prints it (measured with client 28.2.2 against this engine):
# the cause first, then a blank line and the usage hint as the last line.
NO_RUNTIME_CLIENT_28 = ('docker: Error response from daemon: could not select device driver "" with capabilities: '
                        "[[gpu]]\n\nRun 'docker run --help' for more information\n")
# The NVIDIA hook refusing a container, as engines print it (the shapes users report upstream, e.g.
# NVIDIA/nvidia-container-toolkit#394): 20.10 ends with its attach loop's ERRO line, 23 on with the hint.
_HOOK = ("docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
         "failed: unable to start container process: error during container init: error running hook #0: error "
         "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n")
HOOK_NVML_MISMATCH = (_HOOK + "nvidia-container-cli: initialization error: nvml error: driver/library version "
                      "mismatch: unknown.\nERRO[0000] error waiting for container: context canceled \n")
HOOK_DRIVER_TOO_OLD = (_HOOK + "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please "
                       "update your driver to a newer version, or use an earlier cuda container: unknown\n\n"
                       "Run 'docker run --help' for more information\n")


@dataclass(frozen=True)
class FakeGpus:
    count: int = 8
    name: str = "NVIDIA H100 80GB HBM3"
    driver: str = "580.65.06"
    cuda: str = "13.0"
    memory_mib: int = 81559
    broken: str = ""          # nvidia-smi prints this and exits 9 (e.g. NVML_MISMATCH)
    topo: str = ""            # `nvidia-smi topo -m` output; "" -> every pair NV18, as on an HGX H100
    mig: str = "Disabled"     # each GPU's mig.mode.current: Enabled, Disabled, or [N/A] (a GPU without MIG)


def nvlink_topo(count: int, link: str = "NV18") -> str:
    """`nvidia-smi topo -m` of `count` GPUs joined pairwise by `link` (tab-separated, as nvidia-smi prints)."""
    gpus = [f"GPU{i}" for i in range(count)]
    lines = ["\t" + "\t".join([*gpus, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i, name in enumerate(gpus):
        cells = [" X " if j == i else link for j in range(count)]
        lines.append("\t".join([name, *cells, "0-63", "0", "", "N/A"]))
    legend = ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks", ""]
    return "\n".join([*lines, *legend])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_nvidia_smi(folder: Path, gpus: FakeGpus) -> Path:
    """Write `folder/nvidia-smi`; put `folder` first on PATH to use it."""
    folder.mkdir(parents=True, exist_ok=True)
    if gpus.broken:
        body = f'echo "{gpus.broken}"\nexit 9\n'
    else:
        rows = "\n".join(f"{i}, {gpus.name}, {gpus.driver}, {gpus.memory_mib}" for i in range(gpus.count))
        modes = "\n".join(f"{i}, {gpus.mig}" for i in range(gpus.count))
        listing = "\n".join(f"GPU {i}: {gpus.name} (UUID: GPU-fake-{i})" for i in range(gpus.count))
        topo = gpus.topo or nvlink_topo(gpus.count)
        body = f"""case "$*" in
  topo*) cat <<'EOF'
{topo}
EOF
  ;;
  *--query-gpu=index,mig.mode.current*) cat <<'EOF'
{modes}
EOF
  ;;
  *--query-gpu*) cat <<'EOF'
{rows}
EOF
  ;;
  *-L*) cat <<'EOF'
{listing}
EOF
  ;;
  *) echo "| NVIDIA-SMI {gpus.driver}   Driver Version: {gpus.driver}   CUDA Version: {gpus.cuda}     |" ;;
esac
"""
    return _write(folder / "nvidia-smi", "#!/bin/bash\n# fake nvidia-smi (tests/gpu_sim.py)\n" + body)


def _real_client(folder: Path, environ: dict[str, str] | None = None) -> str:
    """The client DOCKER_CLIENT chooses in `environ` (default: this process's); where there is
    none, a path that does not exist (the shim can then only refuse or fail)."""
    try:
        return docker_cli.resolve(docker_cli.setting(environ))
    except docker_cli.DockerError:
        return str(folder / "no-docker-client")


def engine_shim(folder: Path, mode: str, docker: str | None = None, refusal: str = NO_RUNTIME) -> Path:
    """Write `folder/docker-shim`: the real client, but `--gpus` is refused (mode `refuse`, printing
    `refusal` on stderr as the engine would) or dropped (mode `drop`). Set DOCKER_CLIENT to it. It
    wraps `docker`, else the client DOCKER_CLIENT chooses now."""
    real = docker or _real_client(folder)
    if mode not in ("refuse", "drop"):
        raise ValueError(mode)
    folder.mkdir(parents=True, exist_ok=True)
    on_gpus = (f"printf '%s\\n' {shlex.quote(refusal.rstrip(chr(10)))} >&2; exit 125" if mode == "refuse"
               else '[ "$a" = --gpus ] && skip_next=1; continue')
    script = f"""#!/bin/bash
# docker engine shim (tests/gpu_sim.py): mode {mode}
args=()
skip_next=0
for a in "$@"; do
  if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
  case "$a" in
    --gpus|--gpus=*)
      {on_gpus} ;;
  esac
  args+=("$a")
done
exec {real} "${{args[@]}}"
"""
    return _write(folder / "docker-shim", script)


def runner_env(folder: Path, gpus: FakeGpus | None, engine: str = "", base: dict[str, str] | None = None,
               refusal: str = NO_RUNTIME) -> dict[str, str]:
    """An environment for `python -m buildtool validate` on the simulated runner: nvidia-smi is the
    fake one (or missing: PATH without any nvidia-smi), the engine the shim (`refuse`/`drop`) or real."""
    env = dict(base if base is not None else os.environ)
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if gpus is not None:
        fake_nvidia_smi(bin_dir, gpus)
    # Only folders without a real nvidia-smi stay on PATH, so "no GPU" means none at all.
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "nvidia-smi").exists()]
    env["PATH"] = os.pathsep.join([str(bin_dir), *rest])
    if engine:
        env[docker_cli.SETTING] = str(engine_shim(folder / "engine", engine, _real_client(folder, env), refusal))
    return env
