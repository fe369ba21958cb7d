"""Profile a few training steps with torch.profiler and tensorboard_trace_handler into
LOGDIR/RUN (CUDA activity too when a GPU is there). Prints `PROFILE_OK <files>`."""

from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> int:
    logdir, run = sys.argv[1], sys.argv[2]
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = os.path.join(logdir, run)
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(target, worker_name="worker0")) as prof:
        for _ in range(6):
            x = torch.randn(128, 256, device=device)
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    files = sorted(os.listdir(target))
    print("PROFILE_OK " + " ".join(files), flush=True)
    return 0 if files else 1


if __name__ == "__main__":
    sys.exit(main())
