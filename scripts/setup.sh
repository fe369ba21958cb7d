#!/usr/bin/env bash
# Set up what a fresh machine needs to build, test and release images; idempotent.
#   1. apt packages (as root, only those missing): docker.io, docker-registry, skopeo, mmdebstrap and
#      arch-test (the reproducible Debian bases), debootstrap (bench/bench_fresh_machines.py's before arm),
#      qemu-user-static and binfmt-support (linux/arm64 under emulation), and for the SLURM tests
#      slurm-wlm, munge, runc and umoci (SETUP_SKIP_SLURM=1 leaves these out; the tests start their own
#      private SLURM and stop it, nothing here starts a daemon of these packages)
#   2. QEMU for linux/arm64 (scripts/binfmt.sh): binfmt_misc mounted if it is not, the qemu-aarch64
#      entry enabled if it is not, then checked for flag F; a one-line error naming the fix otherwise
#   3. the Docker engine, started with the flags these machines need, only if it is not running
#   4. a local registry on 127.0.0.1:5000 (config/registry.yml, storage .state/registry), only if
#      nothing answers there
#   4b. Node.js and npm (Debian's packages, where `node`/`npm` are missing) and the Sigstore verifier CI runs
#      on every published bundle: `npm ci` in tools/sigstore-verify (exact versions from its package-lock.json,
#      the Node 22 that @sigstore/verify 4.x needs among them, as tools/sigstore-verify/node_modules/.bin/node;
#      redone only when the lock changed)
#   5. .venv: a clean virtual environment with this project installed (`pip install -c requirements.lock
#      -e '.[dev,scaling]'`: pyproject.toml's ranges, requirements.lock's exact versions;
#      the scaling extra is torch 2.13.0, which pip takes from a local CPU wheel where one is configured)
# Rerunning changes nothing; every step says whether it did something or found it done.
# Settings: SETUP_SKIP_VENV=1 skips step 5; SETUP_SKIP_SLURM=1 leaves out the SLURM packages; PYTHON picks
# the interpreter for the venv (python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.state"
REGISTRY_ADDR="127.0.0.1:5000"
DOCKER_SOCK="${DOCKER_SOCK:-/var/run/docker.sock}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$STATE"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 2; }

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
# QEMU user emulation for linux/arm64 images (mmdebstrap --architectures=arm64, builds and containers), registered
# with binfmt_misc by binfmt-support's update-binfmts (step 2).
[[ -x /usr/bin/qemu-aarch64-static ]] || need+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || need+=(binfmt-support)
# Headless Chromium renders the nightly report in its test.
command -v /usr/bin/chromium >/dev/null 2>&1 || need+=(chromium)
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# Node for tools/sigstore-verify (sigstore-js verifies the published Sigstore bundles in CI; step 4b).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# A real SLURM for tests/integration/test_slurm_cluster.py: two nodes on this machine, SLURM's own OCI
# containers through runc, bundles unpacked with umoci (about 13 s to install).
if [[ "${SETUP_SKIP_SLURM:-0}" != 1 ]]; then
  [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd ]] || need+=(slurm-wlm)
  [[ -x /usr/sbin/munged ]] || need+=(munge)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  command -v umoci >/dev/null 2>&1 || need+=(umoci)
fi
if ((${#need[@]})); then
  [[ $(id -u) -eq 0 ]] || die "missing ${need[*]}; run this script as root (it installs them with apt-get)"
  say "installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 1200 apt-get install -y -qq --no-install-recommends "${need[@]}" >"$STATE/apt.log" 2>&1 \
    || { tail -20 "$STATE/apt.log" >&2; die "apt-get install failed (log: .state/apt.log)"; }
  # The docker-registry package starts a system registry on :5000 with its own storage; ours
  # (step 4) uses the repository's config, so stop the packaged one if it grabbed the port.
  if systemctl is-active --quiet docker-registry 2>/dev/null; then systemctl stop docker-registry || true; fi
  # Likewise the SLURM packages' own daemons, when this run installed them: the tests start private ones.
  if [[ " ${need[*]} " == *" slurm-wlm "* || " ${need[*]} " == *" munge "* ]]; then
    for unit in slurmctld slurmd munge; do
      if systemctl is-active --quiet "$unit" 2>/dev/null; then systemctl disable --now "$unit" || true; fi
    done
  fi
else
  say "packages present: docker.io docker-registry skopeo mmdebstrap arch-test debootstrap qemu-user-static binfmt-support chromium node npm$([[ "${SETUP_SKIP_SLURM:-0}" == 1 ]] \
    || echo ' slurm-wlm munge runc umoci')"
fi

# -- 2. QEMU for linux/arm64 ----------------------------------------------------------------
bash "$ROOT/scripts/binfmt.sh"

# -- 3. Docker engine -----------------------------------------------------------------------
engine_up() { timeout 10 /usr/bin/docker -H "unix://$DOCKER_SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
if engine_up; then
  say "Docker engine already running ($DOCKER_SOCK)"
else
  [[ $(id -u) -eq 0 ]] || die "the Docker engine is not running; start it (as root: bash scripts/setup.sh)"
  # iptables is unavailable on these machines: no NAT, so builds and containers that need
  # the network use --network host.
  say "starting dockerd --iptables=false --ip-forward=false --ip-masq=false (log: .state/dockerd.log)"
  # A session of its own (setsid): the engine outlives the shell, job or test run that started it,
  # even when that is stopped with its whole process group.
  setsid nohup dockerd --iptables=false --ip-forward=false --ip-masq=false >>"$STATE/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do engine_up && break; sleep 1; done
  engine_up || { tail -20 "$STATE/dockerd.log" >&2; die "dockerd did not answer within 60 s (log: .state/dockerd.log)"; }
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
  for _ in $(seq 1 30); do registry_up && break; sleep 1; done
  registry_up || { tail -20 "$STATE/registry.log" >&2; die "registry did not answer on $REGISTRY_ADDR within 30 s"; }
  say "registry up"
fi

# -- 4b. the Sigstore verifier (tools/sigstore-verify) -----------------------------------------
VERIFIER="$ROOT/tools/sigstore-verify"
vstamp="$(sha256sum "$VERIFIER/package-lock.json" | cut -c1-16)"
if [[ -f "$VERIFIER/node_modules/.setup-stamp" && "$(cat "$VERIFIER/node_modules/.setup-stamp")" == "$vstamp" ]]; then
  say "sigstore verifier up to date (tools/sigstore-verify)"
else
  say "installing the sigstore verifier (npm ci in tools/sigstore-verify, log: .state/npm.log)"
  (cd "$VERIFIER" && timeout 600 npm ci --no-audit --no-fund --ignore-scripts) >"$STATE/npm.log" 2>&1 \
    || { tail -20 "$STATE/npm.log" >&2; die "npm ci in tools/sigstore-verify failed (log: .state/npm.log)"; }
  echo "$vstamp" >"$VERIFIER/node_modules/.setup-stamp"
  say "sigstore verifier ready"
fi

# -- 5. virtual environment -----------------------------------------------------------------
if [[ "${SETUP_SKIP_VENV:-0}" == 1 ]]; then
  say "skipping .venv (SETUP_SKIP_VENV=1)"
  exit 0
fi
VENV="$ROOT/.venv"
# The stamp holds a hash of pyproject.toml and requirements.lock: reinstall only when they changed.
stamp="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements.lock" | sha256sum | cut -c1-16)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.setup-stamp" && "$(cat "$VENV/.setup-stamp")" == "$stamp" ]] \
   && "$VENV/bin/python" -c 'import buildtool.cli, docker, pytest' >/dev/null 2>&1; then
  say ".venv up to date"
else
  [[ -x "$VENV/bin/python" ]] || { say "creating .venv ($("$PYTHON" --version))"; "$PYTHON" -m venv "$VENV"; }
  say "installing the project into .venv (pip install -c requirements.lock -e '.[dev,scaling]', log: .state/pip.log)"
  (cd "$ROOT" && timeout 1200 "$VENV/bin/python" -m pip install -q -c requirements.lock -e '.[dev,scaling]') \
    >"$STATE/pip.log" 2>&1 \
    || { tail -20 "$STATE/pip.log" >&2; die "pip install into .venv failed (log: .state/pip.log)"; }
  echo "$stamp" >"$VENV/.setup-stamp"
  say ".venv ready"
fi
say "done in $SECONDS s"
