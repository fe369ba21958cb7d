"""PyTorch writes scalars with torch.utils.tensorboard.SummaryWriter into LOGDIR/RUN (for
TensorBoard in another image to read). Writes result.json: {"ok", "error"}."""

from __future__ import annotations

import os
import sys

from probe_io import error_line, result

if __name__ == "__main__":
    try:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(sys.argv[1], sys.argv[2]))
        for step in range(10):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.close()
        result({"ok": True, "error": ""})
    except Exception as exc:  # noqa: BLE001 - the test names it
        result({"ok": False, "error": error_line(exc)})
        sys.exit(1)
