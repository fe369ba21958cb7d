"""The distributed-training strategies `buildtool scaling --strategy` compares (issue 42): each name, the framework
whose images can run it, the workload that trains with it and how that workload is launched.

Every strategy trains the same model (256 -> 512 -> 512 -> 1 MLP, SGD, lr 0.01) on the same synthetic data subset,
batch per rank and epochs, so their times per epoch are comparable. Workloads live in the framework's folder
(image-tests/<framework>/scripts/), beside the in-image checks that run them, except DDP's, the original
benchmark's worker in bench/. A name that is not here is refused (exit 2) naming it; so is a strategy whose
framework is not the cell's.
"""

from __future__ import annotations

from dataclasses import dataclass

from buildtool.common.errors import UserError
from buildtool.common.refs import shown

# A strategy whose speed-up at the largest count is below this fraction of ideal (linear) scaling is flagged in
# the report (`--min-efficiency` overrides it for one run). 0.5: on 2 workers, less than 1.0x is no gain at all.
DEFAULT_MIN_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Strategy:
    name: str        # what --strategy takes
    title: str       # what plots and reports call it
    framework: str   # the framework folder whose images can run it (image-tests/<framework>/)
    worker: str      # the workload, relative to the checkout
    launch: str      # "torchrun" (one process per rank) or "spawn" (the worker starts its own processes)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp", "DDP", "pytorch", "bench/ddp_epochs.py", "torchrun"),
    Strategy("fsdp", "FSDP (fully_shard)", "pytorch", "image-tests/pytorch/scripts/fsdp_epochs.py", "torchrun"),
    Strategy("deepspeed", "DeepSpeed ZeRO-2", "pytorch", "image-tests/pytorch/scripts/deepspeed_epochs.py",
             "torchrun"),
    Strategy("jax-dp", "JAX data parallel (jax.sharding)", "jax", "image-tests/jax/scripts/jax_dp_epochs.py",
             "spawn"),
)}


def parse_strategies(text: str) -> list[Strategy]:
    """`ddp,fsdp` -> the strategies in the order given (each once); an unknown name is an error naming it."""
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise UserError(f"--strategy {shown(text)} must be a comma list of {', '.join(STRATEGIES)}")
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise UserError(f"--strategy: unknown strategy {', '.join(shown(u) for u in unknown)}; known: "
                        f"{', '.join(STRATEGIES)}")
    return [STRATEGIES[name] for name in dict.fromkeys(names)]


def check_framework(strategies: list[Strategy], framework: str, where: str) -> None:
    """Every strategy must be one `framework`'s images run (`where` names the cell or image)."""
    wrong = [s.name for s in strategies if s.framework != framework]
    if wrong:
        runs = ", ".join(s.name for s in STRATEGIES.values() if s.framework == framework)
        raise UserError(f"--strategy {','.join(wrong)}: not supported by {where} (a {framework} image); "
                        f"{framework} runs {runs}")


def one_framework(strategies: list[Strategy]) -> str:
    """The framework all of `strategies` need (one image runs them all)."""
    frameworks = sorted({s.framework for s in strategies})
    if len(frameworks) != 1:
        raise UserError(f"--strategy {','.join(s.name for s in strategies)} mixes frameworks "
                        f"({', '.join(frameworks)}); one image runs one framework's strategies")
    return frameworks[0]
