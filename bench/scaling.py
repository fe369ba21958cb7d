"""DDP scaling benchmark: time per epoch at 1, 2, 4, ... processes (GPUs), side by side in one run.

The ratio a user cares about is what N workers buy over the smallest run (speed-up, and parallel
efficiency against the ideal linear line). Each count trains the same data subset (strong scaling).

    python bench/scaling.py                          # host torch, gloo, 1 and 2 processes
    python bench/scaling.py --image REG/pytorch-cpu-dev:TAG --counts 1,2
    python bench/scaling.py --image REG/pytorch-ngc-dev:TAG --gpus --counts 1,2,4,8 --samples 200000

Writes scaling.json, scaling.csv, time_per_epoch.png and speedup.png to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.common.errors import FailedError, UserError  # noqa: E402
from buildtool.launch.scaling import (  # noqa: E402
    WORKER,
    Launcher,
    RunSettings,
    host_has_module,
    parse_counts,
    run_scaling,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2", help="comma list of process (GPU) counts")
    parser.add_argument("--samples", type=int, default=4096, help="data subset size")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is warm-up")
    parser.add_argument("--batch", type=int, default=64, help="batch size per rank")
    parser.add_argument("--image", default="", help="run inside this image (docker run --network host)")
    parser.add_argument("--gpus", action="store_true", help="pass --gpus=all to docker run (NCCL)")
    parser.add_argument("--shm-size", default="8g", help="docker run --shm-size")
    parser.add_argument("--python", default=sys.executable, help="host Python with torch, when no --image")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "scaling", help="metrics folder")
    args = parser.parse_args(argv)
    try:
        if args.image:
            flags = (f"--shm-size={args.shm_size}", *(("--gpus=all",) if args.gpus else ()))
            launcher = Launcher(kind="docker", image=args.image, docker_flags=flags)
        else:
            if not host_has_module(args.python, "torch"):
                raise UserError(f"{args.python} cannot import torch; pip install '.[scaling]' or pass --image")
            launcher = Launcher(kind="host", python=args.python)
        settings = RunSettings(samples=args.samples, epochs=args.epochs, batch=args.batch,
                               unit="gpus" if args.gpus else "processes", timeout_s=args.timeout)
        result, paths = run_scaling(launcher, parse_counts(args.counts), ROOT / WORKER, args.out, settings)
    except (UserError, FailedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    base = result.runs[0]
    print(f"{'workers':>8} {'s/epoch':>9} {'speed-up':>9} {'ideal':>6} {'efficiency':>10}")
    for r in result.runs:
        print(f"{r.count:>8} {r.time_per_epoch_s:>9.3f} {r.speedup:>8.2f}x {r.count / base.count:>5.0f}x "
              f"{r.efficiency:>10.0%}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
