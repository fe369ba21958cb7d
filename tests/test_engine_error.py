"""What validate quotes when the engine refuses a container: the cause, never the client's closing
usage hint ("Run 'docker run --help' for more information", 23 on) or its attach loop's ERRO line.
Engine shims (tests/gpu_sim.py) print the stderr shapes engines print; no engine needed."""

from __future__ import annotations

import pytest

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.validate import probe
from tests.gpu_sim import HOOK_DRIVER_TOO_OLD, HOOK_NVML_MISMATCH, NO_RUNTIME, NO_RUNTIME_CLIENT_28, engine_shim

NO_RUNTIME_CAUSE = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]]'
NVML_CAUSE = "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch"
TOO_OLD_CAUSE = ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please update your "
                 "driver to a newer version, or use an earlier cuda container")
# Docker 19.03/20.10 with runc before 1.1: the hook's stderr nested and escaped inside the runtime's chain.
ESCAPED_TOO_OLD = ('docker: Error response from daemon: OCI runtime create failed: container_linux.go:349: starting '
                   'container process caused "process_linux.go:449: container init caused \\"process_linux.go:432: '
                   'running prestart hook 0 caused \\\\\\"error running hook: exit status 1, stdout: , stderr: '
                   + TOO_OLD_CAUSE + '\\\\\\\\n\\\\\\"\\"": unknown.\n')


@pytest.mark.parametrize("stderr, cause", [
    (NO_RUNTIME, NO_RUNTIME),
    (NO_RUNTIME_CLIENT_28, NO_RUNTIME_CAUSE),
    ("docker: Error response from daemon: Unknown runtime specified nvidia.\nSee 'docker run --help'.\n",
     "docker: Error response from daemon: Unknown runtime specified nvidia."),
    (HOOK_NVML_MISMATCH, NVML_CAUSE),
    (HOOK_DRIVER_TOO_OLD, TOO_OLD_CAUSE),
    (ESCAPED_TOO_OLD, TOO_OLD_CAUSE),
    ("", "no message"),
], ids=["20.10-no-runtime", "28-no-runtime", "20.10-unknown-runtime", "hook-nvml", "hook-too-old", "escaped-too-old",
        "empty"])
def test_the_cause_line_is_picked_and_the_boilerplate_dropped(stderr, cause):
    assert docker_cli.engine_error(stderr) == cause


@pytest.mark.parametrize("refusal, says", [
    (NO_RUNTIME_CLIENT_28, f"the Docker engine has no NVIDIA runtime for --gpus ({NO_RUNTIME_CAUSE}): install the "
                           "NVIDIA Container Toolkit"),
    (HOOK_DRIVER_TOO_OLD, f"the host's NVIDIA driver is too old for this image ({TOO_OLD_CAUSE}): install NVIDIA "
                          "driver 580.65.06 or newer (CUDA 13.0)"),
    (HOOK_NVML_MISMATCH, f"containers cannot be started with their GPUs ({NVML_CAUSE}); check the NVIDIA driver"),
], ids=["no-runtime", "driver-too-old", "nvml-mismatch"])
def test_a_refused_gpu_container_names_the_engines_cause(tmp_path, monkeypatch, refusal, says):
    """validate's GPU probe through an engine shim that refuses `--gpus` as engines do (the plain start passes)."""
    monkeypatch.setenv(docker_cli.SETTING, str(engine_shim(tmp_path, "refuse", docker="/bin/true", refusal=refusal)))
    with pytest.raises(FailedError) as caught:
        probe.probe_flags("img", ["--shm-size=8g", "--gpus=all"], print, "13.0")
    message = str(caught.value)
    assert says in message, message
    assert "--help" not in message and "ERRO[" not in message and "Auto-detected" not in message


def test_a_refused_run_profile_names_the_engines_cause(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/bash\nprintf '%s\\n' 'docker: Error response from daemon: invalid size: '\"'\"'8q'\"'\"'.' "
                    "'' \"Run 'docker run --help' for more information\" >&2\nexit 125\n")
    fake.chmod(0o755)
    monkeypatch.setenv(docker_cli.SETTING, str(fake))
    with pytest.raises(UserError) as caught:
        probe.probe_flags("img", ["--shm-size=8q"], print)
    assert str(caught.value) == ("cannot start img with its run profile (--shm-size=8q): docker: Error response from "
                                 "daemon: invalid size: '8q'.")
