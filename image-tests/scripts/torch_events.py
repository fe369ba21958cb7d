"""PyTorch writes scalars with torch.utils.tensorboard.SummaryWriter into LOGDIR/RUN (for
TensorBoard in another image to read). Prints `TORCH_EVENTS_OK`."""

from __future__ import annotations

import os
import sys

from torch.utils.tensorboard import SummaryWriter

if __name__ == "__main__":
    writer = SummaryWriter(os.path.join(sys.argv[1], sys.argv[2]))
    for step in range(10):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.close()
    print("TORCH_EVENTS_OK", flush=True)
