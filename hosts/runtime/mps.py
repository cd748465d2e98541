"""GPU sharing on a host with CUDA MPS: the control daemon, and what a slice's container gets.

A slice is a share of one card: a percentage of its compute (streaming multiprocessors) and a
number of MB of its memory. On a host with sharing on, the platform starts the MPS control
daemon with its pipe and log directories under ``MPS_ROOT``; each slice's container is pinned
to its card by UUID, gets the daemon's pipe directory (read-only: connecting to a socket needs
no write on the mount), and runs with the two limits MPS applies to a client:

- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share of the card's SMs its contexts may use;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=<MB>M``, the memory its contexts may allocate on
  device 0, which inside the container is its one pinned card.

Renter variables never set these (``docker_run_argv`` drops every ``CUDA_MPS_*`` a renter
gives, as it drops ``NVIDIA_*``). What MPS does and does not isolate is written in
docs/fractional-gpus.md.
"""

from __future__ import annotations

from dataclasses import dataclass

MPS_ROOT = "/run/gpumkt-mps"
MPS_PIPE_DIRECTORY = f"{MPS_ROOT}/pipe"
MPS_LOG_DIRECTORY = f"{MPS_ROOT}/log"
# Where CUDA looks for the daemon's pipes by default; the variable names it too.
CONTAINER_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108 (inside the container; CUDA's default)
# Variables only the platform sets on a container (a renter's are dropped).
MPS_VARIABLE_PREFIX = "CUDA_MPS_"

_DAEMON_ENV = (
    f"export CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIRECTORY} "
    f"CUDA_MPS_LOG_DIRECTORY={MPS_LOG_DIRECTORY}"
)
# Constant lines, no input in them. Starting is idempotent: a daemon that answers is kept.
MPS_DAEMON_START = (
    f"mkdir -p {MPS_PIPE_DIRECTORY} {MPS_LOG_DIRECTORY} && {_DAEMON_ENV} && "
    "{ echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 "
    "|| nvidia-cuda-mps-control -d; }"
)
MPS_DAEMON_STOP = (
    f"{_DAEMON_ENV} && {{ echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; }}"
)


@dataclass(frozen=True)
class GpuSliceSpec:
    """A slice of one card: ``core_percent`` of its compute, ``memory_mb`` of its memory."""

    core_percent: int
    memory_mb: int

    def environment(self) -> dict[str, str]:
        return {
            "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIRECTORY,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.core_percent),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={self.memory_mb}M",
        }

    def mount(self) -> str:
        """The ``--mount`` value giving the container the daemon's pipes (the platform's own
        directory, never a renter's path)."""
        return f"type=bind,source={MPS_PIPE_DIRECTORY},target={CONTAINER_PIPE_DIRECTORY},readonly"


def mps_daemon_start_argv() -> list[str]:
    return ["sh", "-c", MPS_DAEMON_START]


def mps_daemon_stop_argv() -> list[str]:
    return ["sh", "-c", MPS_DAEMON_STOP]
