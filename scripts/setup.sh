#!/usr/bin/env bash
# Set up what the main job needs (build, push and validate an image; verify and release it); idempotent.
# What only the toolkit's own tests need (QEMU for arm64, Chromium, SLURM, Node and the Sigstore verifier, the
# test extras of .venv) is scripts/setup-tests.sh, which runs this first; the README's test command (and .ci/run)
# runs it.
#   1. apt packages (as root or with sudo, only those missing): docker.io, docker-registry, skopeo, mmdebstrap and
#      arch-test (the reproducible Debian bases), debootstrap (bench/bench_fresh_machines.py's before arm), curl
#      (step 4's check that the registry answers), python3-venv
#   3. the Docker engine, started with the flags these machines need, only if it is not running
#   4. a local registry on 127.0.0.1:5000 or SETUP_REGISTRY_ADDR (config/registry.yml, storage .state/registry), only if
#      nothing answers there
#   5. .venv: a virtual environment with this project and its runtime dependencies (`-e .`: pytest and the
#      plugins validate runs the image tests with among them), installed by uv (the version requirements.lock
#      pins, put into .venv by its pip) with requirements.lock as constraints: pyproject.toml's ranges, the lock's
#      exact versions; uv gets the host's pip settings (index URLs, find-links) as .state/uv.toml, written by
#      buildtool.imagebuild.pipconfig, with which the builds hand them to uv
#   (2, QEMU, and 4b, the Sigstore verifier, are scripts/setup-tests.sh's now, with Chromium and SLURM.)
# Rerunning changes nothing; every step says whether it did something or found it done.
# Settings: SETUP_SKIP_VENV=1 skips step 5; PYTHON picks the interpreter for the venv (python3); DOCKER_SOCK the
# engine's socket; SETUP_REGISTRY_ADDR the local registry's address (127.0.0.1:5000).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.state"
REGISTRY_ADDR="${SETUP_REGISTRY_ADDR:-127.0.0.1:5000}"
DOCKER_SOCK="${DOCKER_SOCK:-/var/run/docker.sock}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$STATE"
# The user's alone: its logs (pip's, uv's, apt's) can quote an index URL's query token, and uv.toml holds credentials.
chmod 700 "$STATE"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 2; }
# shellcheck source=scripts/as-root.sh
source "$(dirname "${BASH_SOURCE[0]}")/as-root.sh"   # can_root, as_root

# -- 1. packages ----------------------------------------------------------------------------
need=()
command -v /usr/bin/docker >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
# The Debian bases: mmdebstrap with SOURCE_DATE_EPOCH (issue 52; arch-test lets it check a foreign architecture
# runs); debootstrap only for the bench's figure of the recipe it replaced.
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v arch-test >/dev/null 2>&1 || need+=(arch-test)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# curl: the check that the registry answers (step 4); without it that check failed whatever the registry did, and
# the script said the registry did not answer.
command -v curl >/dev/null 2>&1 || need+=(curl)
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if ((${#need[@]})); then
  can_root || die "missing ${need[*]}; run this script as root or with passwordless sudo (it installs them with apt)"
  say "installing ${need[*]} (apt-get)"
  as_root timeout 600 apt-get update -qq || die "apt-get update failed (exit $?; 124: timed out after 600 s)"
  as_root env DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >"$STATE/apt.log" 2>&1 \
    || { tail -20 "$STATE/apt.log" >&2; die "apt-get install failed (log: .state/apt.log)"; }
  # The docker-registry package starts a system registry on :5000 with its own storage; ours
  # (step 4) uses the repository's config, so stop the packaged one if it grabbed the port.
  if systemctl is-active --quiet docker-registry 2>/dev/null; then as_root systemctl stop docker-registry || true; fi
else
  say "packages present: docker.io docker-registry skopeo mmdebstrap arch-test debootstrap curl python3-venv"
fi

# -- 3. Docker engine -----------------------------------------------------------------------
engine_up() { timeout 10 /usr/bin/docker -H "unix://$DOCKER_SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
if engine_up; then
  say "Docker engine already running ($DOCKER_SOCK)"
else
  can_root || die "the Docker engine is not running; start it (as root: bash scripts/setup.sh)"
  # iptables is unavailable on these machines: no NAT, so builds and containers that need
  # the network use --network host.
  say "starting dockerd --iptables=false --ip-forward=false --ip-masq=false (log: .state/dockerd.log)"
  # A session of its own (setsid): the engine outlives the shell, job or test run that started it,
  # even when that is stopped with its whole process group.
  # Its pid is written by the shell that then becomes dockerd (exec): `$!` is a subshell or sudo, not the engine.
  # shellcheck disable=SC2016  # $$, $0 and $@ are the inner shell's
  as_root setsid nohup bash -c 'echo "$$" >"$0" && exec "$@"' "$STATE/dockerd.pid" dockerd --iptables=false \
    --ip-forward=false --ip-masq=false >>"$STATE/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do engine_up && break; sleep 1; done
  if ! engine_up; then
    # One that does not answer is stopped: left running, it held the socket and /var/lib/docker against the next try.
    pid="$(cat "$STATE/dockerd.pid" 2>/dev/null || true)"
    if [[ "$pid" =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "dockerd" ]] && as_root kill "$pid"; then
      stopped="stopped it"
    else
      stopped="it is no longer running"
    fi
    tail -20 "$STATE/dockerd.log" >&2
    die "dockerd did not answer within 60 s ($stopped; log: .state/dockerd.log)"
  fi
  say "Docker engine up"
fi

# -- 4. local registry ----------------------------------------------------------------------
registry_up() { curl -fsS -m 5 -o /dev/null "http://$REGISTRY_ADDR/v2/" 2>/dev/null; }
if registry_up; then
  say "registry already answers on $REGISTRY_ADDR"
else
  mkdir -p "$STATE/registry"
  say "starting docker-registry on $REGISTRY_ADDR (config/registry.yml, storage .state/registry, log: .state/registry.log)"
  REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY="$STATE/registry" \
    setsid nohup docker-registry serve "$ROOT/config/registry.yml" >>"$STATE/registry.log" 2>&1 </dev/null &
  registry_pid=$!   # the registry itself: setsid and nohup exec it
  for _ in $(seq 1 30); do registry_up && break; sleep 1; done
  # One that does not answer is stopped: left running, it held the port (or the storage) against the next try.
  registry_up || { kill "$registry_pid" 2>/dev/null || true; tail -20 "$STATE/registry.log" >&2
    die "registry did not answer on $REGISTRY_ADDR within 30 s (stopped it; log: .state/registry.log)"; }
  say "registry up"
fi

# -- 5. virtual environment -----------------------------------------------------------------
if [[ "${SETUP_SKIP_VENV:-0}" == 1 ]]; then
  say "skipping .venv (SETUP_SKIP_VENV=1)"
  exit 0
fi
VENV="$ROOT/.venv"
# A venv with pip (ensurepip: the builds ask the venv's pip for the host's pip settings).
[[ -x "$VENV/bin/python" ]] || { say "creating .venv ($("$PYTHON" --version))"; "$PYTHON" -m venv "$VENV"; }
# uv does not read pip's configuration: the host's index URLs and find-links, as the builds hand them to uv
# (setup-tests.sh installs with the same file). They may carry credentials: the file is this user's alone (0600,
# an earlier one's mode too), never the shell's umask's (0644: every local user read the index token).
PYTHONPATH="$ROOT" "$VENV/bin/python" -c 'import os, sys
from buildtool.imagebuild.pipconfig import HostPip, render_uv_toml
text = render_uv_toml(HostPip.from_host(sys.executable), {})
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.fchmod(fd, 0o600)
with os.fdopen(fd, "w") as out:
    out.write(text)' "$STATE/uv.toml" \
  || die "cannot read the host's pip settings for uv (.state/uv.toml)"
# The stamp holds a hash of pyproject.toml and requirements.lock: reinstall only when they changed.
stamp="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements.lock" | sha256sum | cut -c1-16)"
if [[ -f "$VENV/.setup-stamp" && "$(cat "$VENV/.setup-stamp")" == "$stamp" ]] \
   && "$VENV/bin/python" -c 'import buildtool.cli, docker, pytest, xdist' >/dev/null 2>&1; then
  say ".venv up to date"
else
  # `|| true`: under pipefail a grep that finds nothing ended the script silently, before the line below names it.
  uv_pin="$(grep -E '^uv==' "$ROOT/requirements.lock" | cut -d= -f3 || true)"
  [[ -n "$uv_pin" ]] || die "requirements.lock pins no uv (uv==VERSION); run make lock-deps"
  if [[ "$("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$uv_pin" ]]; then
    say "installing uv $uv_pin into .venv (pip, log: .state/pip.log)"
    timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv==$uv_pin" >"$STATE/pip.log" 2>&1 \
      || { tail -20 "$STATE/pip.log" >&2; die "pip install uv==$uv_pin failed (log: .state/pip.log)"; }
  fi
  say "installing the project into .venv (uv pip install -c requirements.lock -e ., log: .state/uv.log)"
  # --compile-bytecode, as pip does: without the caches every command compiles what it imports again.
  (cd "$ROOT" && UV_CONFIG_FILE="$STATE/uv.toml" timeout 1200 "$VENV/bin/uv" pip install --compile-bytecode \
    --python "$VENV/bin/python" -c requirements.lock -e .) >"$STATE/uv.log" 2>&1 \
    || { tail -20 "$STATE/uv.log" >&2; die "uv pip install into .venv failed (log: .state/uv.log)"; }
  echo "$stamp" >"$VENV/.setup-stamp"
  say ".venv ready"
fi
say "done in $SECONDS s"
