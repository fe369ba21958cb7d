"""Profile a few training steps with torch.profiler and tensorboard_trace_handler into
LOGDIR/RUN (CUDA activity too when a GPU is there), as a user's training does: LOGDIR is
relative to the working directory the image sets. Writes result.json: {"ok", "logdir" (absolute),
"files", "error", "steps" (the step numbers the schedule records), "operators" (operators every traced
step runs), "cuda"} (a PermissionError names the path it could not write)."""

from __future__ import annotations

import os
import sys

from probe_io import error_line, result

WAIT, WARMUP, ACTIVE = 1, 1, 3
STEPS = list(range(WAIT + WARMUP, WAIT + WARMUP + ACTIVE))   # what the profiler records: ProfilerStep#2..#4
OPERATORS = ["aten::linear", "aten::addmm", "aten::relu"]      # what every step of the model below runs


def main() -> int:
    logdir, run = sys.argv[1], sys.argv[2]
    target = os.path.abspath(os.path.join(logdir, run))
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        cuda = torch.cuda.is_available()
        device = torch.device("cuda" if cuda else "cpu")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                     on_trace_ready=tensorboard_trace_handler(target, worker_name="worker0")) as prof:
            for _ in range(WAIT + WARMUP + ACTIVE + 1):
                x = torch.randn(128, 256, device=device)
                loss = model(x).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
        files = sorted(os.listdir(target))
    except Exception as exc:  # noqa: BLE001 - the test names it
        result({"ok": False, "logdir": target, "files": [], "error": error_line(exc)})
        return 1
    result({"ok": bool(files), "logdir": target, "files": files, "cuda": cuda, "steps": STEPS, "operators": OPERATORS,
            "error": "" if files else f"tensorboard_trace_handler wrote nothing into {target}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
