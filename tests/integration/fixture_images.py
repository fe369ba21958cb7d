"""Test images for the image-test layer: this commit's real CPU dev images, and thin layers over
them that each add one fault (or, for the controls, one healthy oddity such as a talking
entrypoint or another user).

The dev images are built by buildtool's own Builder from the committed Dockerfiles (a retag, no
build, when an image with the same content key exists, e.g. from test_build earlier in the
session) and tagged locally as `t-imgtest-<name>:<image id>`, so validate runs exactly them.
Each layer is a small Dockerfile `FROM` its parent, built by the engine's classic builder
(which uses local images as bases) in about a second, tagged
`t-imgtest-<name>:<hash of the parent's image id and the layer>` and reused while both are the
same. A layer that installs packages gets wheels downloaded on the host (the host's pip settings,
never copied into a layer) and installs them offline; one that needs a shared library (a stand-in
for NVIDIA's cuDNN or NCCL) gets it compiled on the host by gcc and copied in. Every layer relabels its content key, so
`buildtool build` can never take a fault image for the real one. Test fixtures, never released.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from buildtool.common import docker_cli
from buildtool.contracts import label_keys
from tests.conftest import SYSTEM_TMP

REPO = Path(__file__).resolve().parents[2]
PREFIX = "t-imgtest"
BUILD_TIMEOUT_S = 600
SITE = "/opt/venv/lib/python3.11/site-packages"
DEV_CELLS = {"pytorch": "pytorch-cpu:2.13", "tensorflow": "tensorflow-cpu:2.21", "jax": "jax-cpu:0.10"}
# Where the fixtures' dev images are tagged by the Builder (never pushed).
DEV_REGISTRY = "127.0.0.1:5000/t-imgtest"


@dataclass(frozen=True)
class Layer:
    name: str
    parent: str              # a dev image ("pytorch", "tensorflow") or another layer
    what: str                # the fault or the oddity, in words
    dockerfile: str          # the instructions after FROM
    wheels: tuple[str, ...] = ()  # requirements downloaded on the host into wheels/ of the build context
    # Packages also dropped from the parent's lock label, as a build from a lock without them would write it.
    unlocked: tuple[str, ...] = ()
    # Shared libraries compiled on the host into libs/ of the build context: (file name, C source).
    clibs: tuple[tuple[str, str], ...] = ()


def _nvlibs(cudnn: int, nccl: int) -> tuple[tuple[str, str], ...]:
    """libcudnn.so.9 and libnccl.so.2 whose version calls report these codes (cudnn_version.h, nccl.h)."""
    return (("libcudnn.so.9", f"#include <stddef.h>\nsize_t cudnnGetVersion(void) {{ return {cudnn}; }}\n"),
            ("libnccl.so.2", f"int ncclGetVersion(int *version) {{ *version = {nccl}; return 0; }}\n"))


_NVLIBS_COPY = "COPY libs/ /usr/local/lib/\nRUN ldconfig\n"


def _py(path: str, code: str) -> str:
    """A RUN line that writes `code` to `path` (printf keeps the lines; no shell quoting surprises)."""
    lines = " ".join("'" + line.replace("'", "'\"'\"'") + "'" for line in code.strip("\n").splitlines())
    return f"RUN printf '%s\\n' {lines} > {path}\n"


def _append(path: str, code: str) -> str:
    lines = " ".join("'" + line.replace("'", "'\"'\"'") + "'" for line in code.strip("\n").splitlines())
    return f"RUN printf '%s\\n' {lines} >> {path}\n"


_TALK = """#!/bin/sh
echo "=============== Welcome to the imgtest container ==============="
echo "NVIDIA Release 25.10 (build 1234) -- this banner is what NGC prints" >&2
echo "ulimit stack 8192 | /dev/shm 64m | 42"
"""
_ENTRY = _TALK + 'exec "$@"\n'
_SITE_BANNER = """import sys
print("Welcome to the imgtest image: 8 GiB | 42")
print("sitecustomize says hello", file=sys.stderr)
"""
_BANNERS = (
    "USER root\n"
    + _py("/etc/profile.d/zz-imgtest-banner.sh", _TALK)
    + _py("/etc/imgtest-bash-env.sh", _TALK)
    + _py("/usr/local/bin/imgtest-entrypoint.sh", _ENTRY)
    + _py(f"{SITE}/imgtest_banner.py", _SITE_BANNER)
    + f"RUN echo 'import imgtest_banner' > {SITE}/imgtest-banner.pth\n"
    + "RUN chmod 755 /usr/local/bin/imgtest-entrypoint.sh && echo 'Welcome (motd)' > /etc/motd"
      " && cat /etc/profile.d/zz-imgtest-banner.sh >> /etc/bash.bashrc"
      " && useradd --create-home --uid 1000 trainer\n"
    "ENV BASH_ENV=/etc/imgtest-bash-env.sh ENV=/etc/imgtest-bash-env.sh\n"
    'ENTRYPOINT ["/usr/local/bin/imgtest-entrypoint.sh"]\n'
    'CMD ["bash"]\n'
    "USER trainer\n"
)
_SLOW_TORCH = """import sys
import time


class _SlowTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            time.sleep(600)
        return None


sys.meta_path.insert(0, _SlowTorch())
"""
# A cold page cache without depending on this machine's disk: the first `import torch` in a container
# stays busy (CPU and reads through the page cache) for longer than the fixed 60 s the import was
# once given, then the container is "warm" (a marker in /tmp), as the page cache would be.
SLOW_IMPORT_S = 75
_SLOW_BUSY_TORCH = f"""import os
import sys
import time

_MARK = "/tmp/imgtest-torch-warm"


class _SlowBusyTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not os.path.exists(_MARK):
            end = time.monotonic() + {SLOW_IMPORT_S}
            with open(sys.executable, "rb") as fh:
                while time.monotonic() < end:
                    fh.seek(0)
                    fh.read(1 << 20)
            open(_MARK, "w").close()
        return None


sys.meta_path.insert(0, _SlowBusyTorch())
"""
_NOOP_ALL_REDUCE = """

def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):  # imgtest fault: does nothing
    return None
"""
_WORKER_HANGS = """

import threading as _imgtest_threading

_imgtest_worker_loop = _worker_loop


def _worker_loop(*args, **kwargs):  # imgtest fault: worker 1 deadlocks before its first batch
    if args[10] == 1:
        _imgtest_threading.Event().wait()
    return _imgtest_worker_loop(*args, **kwargs)
"""
_WORKER_CRASHES = """

import os as _imgtest_os
import signal as _imgtest_signal

_imgtest_worker_loop = _worker_loop


def _worker_loop(*args, **kwargs):  # imgtest fault: worker 1 segfaults
    if args[10] == 1:
        _imgtest_os.kill(_imgtest_os.getpid(), _imgtest_signal.SIGSEGV)
    return _imgtest_worker_loop(*args, **kwargs)
"""
_RANK1_CRASHES = """

import os as _imgtest_os
import signal as _imgtest_signal

_imgtest_ddp_init = DistributedDataParallel.__init__


def _imgtest_init(self, *args, **kwargs):  # imgtest fault: rank 1 segfaults when it builds DDP
    if _imgtest_os.environ.get("RANK") == "1":
        _imgtest_os.kill(_imgtest_os.getpid(), _imgtest_signal.SIGSEGV)
    _imgtest_ddp_init(self, *args, **kwargs)


DistributedDataParallel.__init__ = _imgtest_init
"""
_JAX_PSUM_NOOP = """

def psum(x, axis_name, *, axis_index_groups=None):  # imgtest fault: sums nothing across devices
    return x
"""
# FSDP2's reduce-scatter (both its communication classes) patched to keep each rank's own shard of its own
# gradient, no sum across ranks: the ranks still agree on the gathered parameters and the loss still falls.
_FSDP_NO_REDUCE = """


def _imgtest_no_reduce(self, output_tensor, input_tensor, group, op, async_op=False):  # imgtest fault
    rank, n = dist.get_rank(group), output_tensor.numel()
    output_tensor.copy_(input_tensor[rank * n:(rank + 1) * n])


DefaultReduceScatter.__call__ = _imgtest_no_reduce
ProcessGroupAllocReduceScatter.__call__ = _imgtest_no_reduce
"""
_JAX_INIT_HANGS = """

import threading as _imgtest_threading


def initialize(*args, **kwargs):  # imgtest fault: joining the coordinator blocks forever, no timeout
    _imgtest_threading.Event().wait()
"""
_JAX_TRACES_NOTHING = """

import contextlib as _imgtest_contextlib


@_imgtest_contextlib.contextmanager
def trace(log_dir, create_perfetto_link=False, create_perfetto_trace=False):  # imgtest fault: traces nothing
    yield
"""
_JAX_STEPS_UNNAMED = """

import contextlib as _imgtest_contextlib


class StepTraceAnnotation(_imgtest_contextlib.nullcontext):  # imgtest fault: step annotations are dropped
    def __init__(self, name, **kwargs):
        super().__init__()
"""
# What a profiler build whose activity collection records nothing leaves: a trace file with its metadata
# events (process and thread names) and none of the operators or kernels of the traced steps.
_TRACE_METADATA_ONLY = """

_imgtest_export_chrome_trace = _KinetoProfile.export_chrome_trace


def _imgtest_metadata_only(self, path, *args, **kwargs):  # imgtest fault: the trace keeps metadata events only
    done = _imgtest_export_chrome_trace(self, path, *args, **kwargs)
    import gzip as _imgtest_gzip
    import json as _imgtest_json

    opener = _imgtest_gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        trace = _imgtest_json.load(fh)
    trace["traceEvents"] = [e for e in trace.get("traceEvents", []) if e.get("ph") == "M"]
    with opener(path, "wt") as fh:
        _imgtest_json.dump(trace, fh)
    return done


_KinetoProfile.export_chrome_trace = _imgtest_metadata_only
"""
# Proxies as a site behind one sets them for pip, baked into the image without no_proxy.
PROXY = "http://proxy.invalid:3128"
_TB_DROPS_EVENTS = """


def _imgtest_add_event(self, event):  # imgtest fault: events are dropped, never written
    return None


EventFileWriter.add_event = _imgtest_add_event
"""

LAYERS: dict[str, Layer] = {layer.name: layer for layer in [
    # A Python image for fixtures that need nothing else (the PyTorch dev image, relabelled).
    Layer("python", "pytorch", "a plain Python 3.11 image", ""),
    # -- controls: unusual but healthy ------------------------------------------------------------
    Layer("pytorch-banners", "pytorch", "banners everywhere (profile.d, bashrc, BASH_ENV, motd, an NGC-like "
          "entrypoint that prints and execs, a start-up hook that prints at every Python start), run as another "
          "user (uid 1000, home, writable workdir)", _BANNERS),
    Layer("tensorflow-banners", "tensorflow", "the same banners and user on TensorFlow", _BANNERS),
    # -- faults -----------------------------------------------------------------------------------
    # Debian's own /usr/lib/python3.11/sitecustomize.py comes first on sys.path; a .pth file runs at
    # every start-up as a site hook does.
    Layer("pytorch-import-hangs", "pytorch", "a start-up hook (.pth) makes `import torch` sleep 600 s",
          _py(f"{SITE}/imgtest_slow.py", _SLOW_TORCH) + f"RUN echo 'import imgtest_slow' > {SITE}/imgtest-slow.pth\n"),
    Layer("pytorch-import-slow", "pytorch", f"the first `import torch` in a container stays busy for {SLOW_IMPORT_S} s "
          "(a cold page cache, without a cold disk)",
          _py(f"{SITE}/imgtest_slowbusy.py", _SLOW_BUSY_TORCH)
          + f"RUN echo 'import imgtest_slowbusy' > {SITE}/imgtest-slowbusy.pth\n"),
    Layer("pytorch-labels-lie", "pytorch", "labels that lie: Python 3.12, version 2.14, accelerator cuda, a "
          "run profile of 64m", f'LABEL {label_keys.PYTHON}="3.12" {label_keys.OCI_VERSION}="2.14" '
          f'{label_keys.ACCELERATOR}="cuda" {label_keys.RUN_PROFILE}="{{\\"shm_size\\": \\"64m\\"}}"\n'),
    Layer("pytorch-nolock", "pytorch", "the lock label emptied (what an image not built by buildtool says)",
          f'LABEL {label_keys.PACKAGES}=""\n'),
    Layer("pytorch-mislabelled", "pytorch", "framework-version label 2.12.0+cpu on torch 2.13.0+cpu",
          f'LABEL {label_keys.FRAMEWORK_VERSION}="2.12.0+cpu"\n'),
    Layer("pytorch-profiler-nostatic", "pytorch", "torch-tb-profiler without its static frontend",
          f"RUN rm -rf {SITE}/torch_tb_profiler/static\n"),
    Layer("pytorch-profiler-noentrypoint", "pytorch", "torch-tb-profiler installed, its entry point gone",
          f"RUN sed -i '/tensorboard_plugins/,$d' {SITE}/torch_tb_profiler-0.4.3.dist-info/entry_points.txt\n"),
    Layer("pytorch-noprofiler", "pytorch", "torch-tb-profiler uninstalled",
          "RUN /opt/venv/bin/python -m pip uninstall -y torch-tb-profiler\n"),
    # What a framework lock with mpmath deleted by hand builds: sympy without mpmath, and a lock label that
    # does not list it (so the locked-packages check passes; only `pip check` sees it).
    Layer("pytorch-nompmath", "pytorch", "mpmath missing (uninstalled, and not in the lock label), sympy needs it",
          "RUN /opt/venv/bin/python -m pip uninstall -y mpmath\n", unlocked=("mpmath",)),
    Layer("pytorch-notensorboard", "pytorch", "the `tensorboard` script removed",
          "RUN rm /opt/venv/bin/tensorboard\n"),
    Layer("pytorch-allreduce-noop", "pytorch", "torch.distributed.all_reduce patched into a no-op",
          _append(f"{SITE}/torch/distributed/distributed_c10d.py", _NOOP_ALL_REDUCE)),
    Layer("pytorch-nobody", "pytorch", "default user 65534 with an unwritable HOME and working directory",
          "RUN chmod 755 /workspace\nUSER 65534:65534\n"),
    # What a base without ca-certificates gives (a slim image whose Dockerfile forgot it): no CA bundle,
    # no hashed certificates, so urllib's downloads (torch.hub) fail with CERTIFICATE_VERIFY_FAILED.
    Layer("pytorch-nocerts", "pytorch", "ca-certificates purged: Python's SSL context trusts no CA",
          "RUN dpkg --purge --force-depends ca-certificates\n"),
    Layer("pytorch-tmp-readonly", "pytorch", "/tmp not writable for the image's user (uid 1000)",
          "RUN useradd --create-home --uid 1000 trainer && chmod 755 /tmp\nUSER trainer\n"),
    # Issue 54: what testinfra's `host` reads in the container, not in the image config.
    Layer("pytorch-requires-cuda", "pytorch", "a CPU image that demands a CUDA driver (NVIDIA_REQUIRE_CUDA)",
          "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.4\n"),
    Layer("pytorch-tensorboard-exposed", "pytorch", "TensorBoard's default address changed from localhost to every "
          "interface", f"RUN sed -i 's/host = \"localhost\"/host = \"0.0.0.0\"/' {SITE}/tensorboard/program.py\n"),
    Layer("pytorch-gloo-ifname", "pytorch", "GLOO_SOCKET_IFNAME names an interface that does not exist",
          "ENV GLOO_SOCKET_IFNAME=nonexistent0\n"),
    Layer("pytorch-gloo-loopback", "pytorch", "GLOO_SOCKET_IFNAME=lo baked into the image (works on one host only)",
          "ENV GLOO_SOCKET_IFNAME=lo\n"),
    Layer("pytorch-trace-metadata-only", "pytorch", "torch.profiler writes traces of metadata events only (no "
          "operator or kernel activity)", _append(f"{SITE}/torch/profiler/profiler.py", _TRACE_METADATA_ONLY)),
    Layer("pytorch-worker-hangs", "pytorch", "DataLoader worker 1 deadlocks",
          _append(f"{SITE}/torch/utils/data/_utils/worker.py", _WORKER_HANGS)),
    Layer("pytorch-worker-crashes", "pytorch", "DataLoader worker 1 segfaults",
          _append(f"{SITE}/torch/utils/data/_utils/worker.py", _WORKER_CRASHES)),
    Layer("pytorch-rank-crashes", "pytorch", "DDP rank 1 segfaults",
          _append(f"{SITE}/torch/nn/parallel/distributed.py", _RANK1_CRASHES)),
    Layer("pytorch-notorchrun", "pytorch", "no `torchrun` in the image", "RUN rm /opt/venv/bin/torchrun\n"),
    # What a derived image's clean-up and hand patch do to the build's bytecode: sympy's deleted, and torch's
    # __init__.py edited after it was compiled (its bytecode no longer matches, so every import compiles it).
    Layer("pytorch-bytecode-broken", "pytorch", "sympy's bytecode deleted, torch/__init__.py edited after the build",
          f"RUN find {SITE}/sympy -name __pycache__ -type d -prune -exec rm -rf {{}} +\n"
          + _append(f"{SITE}/torch/__init__.py", "# patched by hand")),
    Layer("pytorch-entrypoint-ignores", "pytorch", "an entrypoint that ignores the command and exits",
          'ENTRYPOINT ["python3", "-c", "print(\'notebook server ready\')"]\n'),
    Layer("pytorch-entrypoint-blocks", "pytorch", "an entrypoint that ignores the command and runs forever",
          'ENTRYPOINT ["/bin/sh", "-c", "echo serving; exec sleep infinity"]\n'),
    Layer("pytorch-fsdp-noreduce", "pytorch", "FSDP's gradient reduce-scatter keeps each rank's own gradient "
          "shard (no sum across ranks)", _append(f"{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
                                                  _FSDP_NO_REDUCE)),
    # What an NGC tag re-pushed with another cuDNN looks like to the library check: libcudnn.so.9 and
    # libnccl.so.2 on the loader's path reporting 9.6.0 and 2.27.7 (validated against a matrix whose
    # cell promises cuDNN 9.14.0.64 and NCCL 2.27.7); the control's report exactly the promise.
    Layer("pytorch-nvlibs-other", "pytorch", "cuDNN 9.6.0 and NCCL 2.27.7 on the dynamic loader's path",
          _NVLIBS_COPY, clibs=_nvlibs(90600, 22707)),
    Layer("pytorch-nvlibs-promised", "pytorch", "cuDNN 9.14.0 and NCCL 2.27.7 on the dynamic loader's path",
          _NVLIBS_COPY, clibs=_nvlibs(91400, 22707)),
    Layer("tensorflow-profile-nostatic", "tensorflow", "the profile plugin without its static frontend",
          f"RUN rm -rf {SITE}/xprof/static\n"),
    # tensorboard 2.20 imports pkg_resources on start; setuptools 82 dropped it.
    Layer("tensorflow-setuptools82", "tensorflow", "tensorboard 2.20 with setuptools 82 (crashes on start)",
          "COPY wheels /tmp/imgtest-wheels\n"
          "RUN /opt/venv/bin/python -m pip install --no-index --no-deps /tmp/imgtest-wheels/*.whl"
          " && rm -rf /tmp/imgtest-wheels\n",
          wheels=("tensorboard==2.20.0", "setuptools==82.0.0")),
    # -- JAX (jax-cpu) ------------------------------------------------------------------------------
    Layer("jax-banners", "jax", "the same banners and user on JAX", _BANNERS),
    # jax.lax imports psum (and pmean calls it) from jax._src.lax.parallel after the module ran, so
    # a definition appended there replaces it everywhere.
    Layer("jax-psum-noop", "jax", "jax.lax.psum patched to return its input (no cross-device sum)",
          _append(f"{SITE}/jax/_src/lax/parallel.py", _JAX_PSUM_NOOP)),
    Layer("jax-init-hangs", "jax", "jax.distributed.initialize blocks forever (its timeout ignored)",
          _append(f"{SITE}/jax/_src/distributed.py", _JAX_INIT_HANGS)),
    Layer("jax-profiler-notrace", "jax", "jax.profiler.trace patched to trace nothing",
          _append(f"{SITE}/jax/_src/profiler.py", _JAX_TRACES_NOTHING)),
    Layer("jax-steps-unnamed", "jax", "jax.profiler.StepTraceAnnotation patched to record nothing",
          _append(f"{SITE}/jax/_src/profiler.py", _JAX_STEPS_UNNAMED)),
    Layer("jax-mislabelled", "jax", "framework-version label 0.10.1 on jax 0.10.2",
          f'LABEL {label_keys.FRAMEWORK_VERSION}="0.10.1"\n'),
    Layer("jax-noprofile", "jax", "the profile plugin (tensorboard-plugin-profile, xprof) uninstalled",
          "RUN /opt/venv/bin/python -m pip uninstall -y tensorboard-plugin-profile xprof\n"),
    Layer("jax-proxy", "jax", "http_proxy and https_proxy (both cases) baked into the image without no_proxy",
          f"ENV http_proxy={PROXY} https_proxy={PROXY} HTTP_PROXY={PROXY} HTTPS_PROXY={PROXY}\n"),
    Layer("jax-profile-nonative", "jax", "the profile plugin's native module (xprof's _pywrap_profiler_plugin.so) "
          "missing", f"RUN rm {SITE}/xprof/convert/_pywrap_profiler_plugin.so\n"),
    Layer("jax-profile-nostatic", "jax", "the profile plugin without its static frontend",
          f"RUN rm -rf {SITE}/xprof/static\n"),
    Layer("jax-events-dropped", "jax", "TensorBoard's event writer drops every event (it writes no file)",
          _append(f"{SITE}/tensorboard/summary/writer/event_file_writer.py", _TB_DROPS_EVENTS)),
]}
RECIPES = {**{name: None for name in DEV_CELLS}, **LAYERS}  # every fixture name


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return docker_cli.docker(*args, timeout=timeout, check=check)


def image_id(ref: str) -> str | None:
    proc = _docker("image", "inspect", "--format", "{{.Id}}", ref, check=False, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else None


def dev_image(name: str) -> str:
    """This commit's dev image of a CPU cell, built (or retagged) by buildtool and tagged locally."""
    from buildtool.imagebuild.builder import Builder, BuildOptions
    from buildtool.matrix.loader import load_matrix
    from buildtool.matrix.plan import Settings, git_revision, plan_cell

    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    settings = Settings(registry=DEV_REGISTRY, release_registry=DEV_REGISTRY, base_mirror="127.0.0.1:5000")
    revision = git_revision(REPO)
    plan = plan_cell(next(c for c in matrix.cells if c.key == DEV_CELLS[name]), settings, revision)
    with tempfile.TemporaryDirectory(prefix="t-imgtest-build-") as logs:
        (result,) = Builder(REPO, matrix.source, settings, revision, BuildOptions(push=False, log_dir=Path(logs)),
                            log=lambda line: print(line, file=sys.stderr)).run([plan])
        if not result.ok:
            raise RuntimeError(f"building the {plan.cell.key} dev image failed: {result.message}")
    ident = image_id(plan.dev_ref)
    assert ident, plan.dev_ref
    ref = f"{PREFIX}-{name}:{ident.split(':')[-1][:12]}"
    _docker("tag", plan.dev_ref, ref)
    return ref


def layer_ref(layer: Layer, parent_ref: str) -> str:
    parent_id = image_id(parent_ref) or parent_ref
    body = "\0".join([parent_id, layer.dockerfile, *layer.wheels, *(f"unlocked:{n}" for n in layer.unlocked),
                      *(f"clib:{name}:{source}" for name, source in layer.clibs)]).encode()
    return f"{PREFIX}-{layer.name}:{hashlib.sha256(body).hexdigest()[:12]}"


def _context(layer: Layer, parent_ref: str, folder: Path) -> None:
    relabel = (f'LABEL {label_keys.CONTENT_KEY}="fixture:{layer.name}" {label_keys.FIXTURE}="true" '
               f'{label_keys.FIXTURE_FAULT}="{layer.name}"\n')
    if layer.unlocked:
        relabel += f"LABEL {label_keys.PACKAGES}={json.dumps(_lock_label_without(parent_ref, layer.unlocked))}\n"
    (folder / "Dockerfile").write_text(f"FROM {parent_ref}\n{layer.dockerfile}{relabel}")
    if layer.clibs:
        (folder / "libs").mkdir()
        for name, source in layer.clibs:
            (folder / f"{name}.c").write_text(source)
            subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname," + name, "-o", str(folder / "libs" / name),
                            str(folder / f"{name}.c")], check=True, capture_output=True, timeout=120)
    if layer.wheels:
        (folder / "wheels").mkdir()
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--dest", str(folder / "wheels"), *layer.wheels], check=True, capture_output=True,
                       timeout=BUILD_TIMEOUT_S)


def _lock_label_without(parent_ref: str, names: tuple[str, ...]) -> str:
    """The parent's lock label (name -> version JSON) less `names`; each must be in it."""
    text = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label_keys.PACKAGES}"}}}}',
                   parent_ref, timeout=60).stdout.strip()
    locked = json.loads(text)
    missing = [n for n in names if n not in locked]
    if missing:
        raise RuntimeError(f"{parent_ref}'s lock label has no {missing}: the fault would not be the one meant")
    return json.dumps({k: v for k, v in locked.items() if k not in names}, sort_keys=True)


def build_layer(layer: Layer, parent_ref: str, ref: str) -> None:
    import docker

    client = docker.from_env(timeout=BUILD_TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="t-imgtest-ctx-") as tmp:
        folder = Path(tmp)
        _context(layer, parent_ref, folder)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(folder, arcname=".")
        buf.seek(0)
        # The classic builder: BuildKit here resolves FROM through a registry, not the local store.
        log = []
        for chunk in client.api.build(fileobj=buf, custom_context=True, tag=ref, rm=True, forcerm=True,
                                      decode=True, pull=False, network_mode="none"):
            log.append(str(chunk.get("stream") or chunk.get("error") or ""))
            if "error" in chunk:
                raise RuntimeError(f"building fixture {ref} failed: {chunk['error']}\n{''.join(log)[-2000:]}")


_DEV: dict[str, str] = {}


def ensure(name: str) -> str:
    """Build (or reuse) the fixture image `name` and its parents; returns its local reference.
    One process at a time on this machine (`make test` runs on several xdist workers): the second
    finds what the first built and reuses it instead of building it again beside it."""
    with one_builder():
        return _ensure(name)


@contextlib.contextmanager
def one_builder() -> Iterator[None]:
    """This machine's one image builder at a time (a build that fills the shared mirror's bases takes it too)."""
    with open(SYSTEM_TMP / "dl-images-fixture-images.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _ensure(name: str) -> str:
    if name in DEV_CELLS:
        if name not in _DEV:
            _DEV[name] = dev_image(name)
        return _DEV[name]
    layer = LAYERS[name]
    parent = _ensure(layer.parent)
    ref = layer_ref(layer, parent)
    if image_id(ref) is None:
        build_layer(layer, parent, ref)
    return ref


if __name__ == "__main__":  # build every fixture once: python tests/integration/fixture_images.py
    for key in RECIPES:
        print(key, ensure(key), flush=True)
