"""The framework table: everything the pipeline needs to know about a framework, one row each.

Adding an image of a new framework is: its matrix entry, a template, one row here and its
image-tests group (image-tests/<name>/). Nothing else names frameworks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Framework:
    name: str                       # the matrix's `framework:` value; also its image-tests group
    module: str                     # the import whose __version__ proves the framework's version
    distributions: tuple[str, ...]  # pip names that carry it (a stand-in's requirement is found by these)
    gpu_count_expr: str             # Python, evaluated in the image with `module` imported: GPUs it sees
    events_writer: tuple[str, ...]  # image-tests/scripts command that writes TensorBoard scalars "loss"
    shm_workers: str = "python"     # how shm_workers.py loads batches through /dev/shm: torch DataLoader or python
    cuda_build_expr: str = "''"     # Python, in the image: the CUDA version the framework was built with, '' if none
    container_version_env: str = "" # what an NGC container of this framework sets to its release (25.10)
    local_versions: str = "plain"   # how builds mark themselves in __version__'s local part (contracts.versions)

    @property
    def test_group(self) -> str:
        return self.name


COMMON_GROUP = "common"

_TABLE: dict[str, Framework] = {}


def register(framework: Framework) -> Framework:
    """Add a row (the shipped rows below; tests add fixture frameworks this way)."""
    _TABLE[framework.name] = framework
    return framework


def unregister(name: str) -> None:
    _TABLE.pop(name, None)


register(Framework(
    name="pytorch", module="torch", distributions=("torch",),
    gpu_count_expr="torch.cuda.device_count()",
    events_writer=("torch_events.py",), shm_workers="torch", local_versions="torch",
    cuda_build_expr="torch.version.cuda or ''", container_version_env="NVIDIA_PYTORCH_VERSION",
))
register(Framework(
    name="tensorflow", module="tensorflow", distributions=("tensorflow", "tensorflow-cpu"),
    gpu_count_expr="len(tensorflow.config.list_physical_devices('GPU'))",
    events_writer=("tf_write.py", "--no-profile"),
    cuda_build_expr=("tensorflow.sysconfig.get_build_info().get('cuda_version', '') "
                     "if tensorflow.test.is_built_with_cuda() else ''"),
    container_version_env="NVIDIA_TENSORFLOW_VERSION",
))


def names() -> tuple[str, ...]:
    return tuple(_TABLE)


def get(name: str) -> Framework:
    try:
        return _TABLE[name]
    except KeyError:
        raise KeyError(f"unknown framework {name!r}; known: {', '.join(_TABLE)}") from None


def test_groups() -> tuple[str, ...]:
    """Every image-tests group a cell may list."""
    return (COMMON_GROUP, *(f.test_group for f in _TABLE.values()))


def others(name: str) -> tuple[Framework, ...]:
    """The frameworks a cross-framework check pairs `name` with."""
    return tuple(f for f in _TABLE.values() if f.name != name)
