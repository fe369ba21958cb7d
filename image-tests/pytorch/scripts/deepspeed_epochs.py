"""DeepSpeed ZeRO stage 2 training over the scaling benchmark's synthetic data set, timing every epoch; launched by
torchrun (`buildtool scaling --strategy deepspeed`; the GPU smoke runs it on GPUs). The same model, data, sampler
and SGD as bench/ddp_epochs.py and fsdp_epochs.py; optimizer states and gradients partitioned across ranks
(ZeRO-2), parameters replicated.

Where DeepSpeed cannot run, the worker prints `SCALING_NOT_RUN <reason>` and exits 0, so the strategy is
reported as not run on this runner, never as a pass: DeepSpeed not installed in the image, or no accelerator
DeepSpeed supports. On CPU (DS_ACCELERATOR=cpu) DeepSpeed 0.19 JIT-compiles its shared-memory collective op
(shm_comm) at init, which needs a C++ compiler; without one this worker turns that op off and DeepSpeed's
collectives go through torch.distributed's gloo (recorded as `shm_comm`).

At the end every rank hashes its parameters (`identical`), and with SCALING_VERIFY=1 (default) rank 0 replays the
training unsharded in one process on the union of every rank's batches (`matches_reference`, `max_abs_diff`).
Rank 0 prints `SCALING_RESULT <json>` as the other workers do. What it shares with fsdp_epochs.py is torch_epochs.py
beside it (a SLURM job embeds both).
"""

from __future__ import annotations

import os
import shutil

import torch
import torch_epochs as epochs


def not_run(reason: str) -> dict:
    if int(os.environ.get("RANK", "0")) == 0:
        print("SCALING_NOT_RUN " + reason, flush=True)
    epochs.write("result.json", {"not_run": reason})
    return {"not_run": reason}


def main() -> dict:
    run = epochs.Run()
    try:
        import deepspeed
    except ImportError as exc:
        return not_run(f"DeepSpeed is not installed in this image ({type(exc).__name__}: {exc})")
    shm_comm = "built"
    if not run.cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # its JIT build needs a compiler
            shm_comm = "off: no C++ compiler to JIT-build it; collectives through gloo"
    deepspeed.init_distributed(dist_backend=run.backend)
    run.start()
    model = epochs.model_for(run.device)
    # No gradient clipping (DeepSpeed 0.19 clips at 1.0 unless told): the same SGD as the other strategies.
    config = {"train_micro_batch_size_per_gpu": run.batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=epochs.LR),
                                           config=config)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        return loss

    epoch_times, losses = run.train(step)
    full = {k: v.detach().cpu().float() for k, v in engine.module.state_dict().items()}  # ZeRO-2: replicated
    head = {"strategy": "deepspeed", "zero_stage": 2, "shm_comm": shm_comm, "deepspeed_version": deepspeed.__version__}
    return run.finish(head, full, epoch_times, losses)


if __name__ == "__main__":
    epochs.exit_after(main)
