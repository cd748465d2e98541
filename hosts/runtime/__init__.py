"""The Docker runtime, spoken over SSH: the hosts app's public face for Docker.

Other apps import from ``hosts.runtime`` only; which module holds what:

- ``container_spec``: ``ContainerSpec`` and its field checks (image, env, ports, volumes,
  names, GPU UUIDs; ``InvalidContainerSpec`` names the field), the labels and log caps, the
  platform's network names (``TENANT_NETWORK``), ``cpu_shares`` and ``docker_run_argv``, the
  pure function from a spec to the only ``docker run`` flags the platform ever gives: no
  ``--privileged``, no host networking, no bind mounts, no Docker socket, no renter
  ``NVIDIA_*`` variables, GPUs pinned by UUID, logs capped, no ``NET_RAW`` nor swap.
- ``registries``: image references (``image_repository``, ``registry_of``) and the refusal of
  registries on the provider's own network (``registry_refusal``, ``check_registry``).
- ``mps``: GPU sharing with CUDA MPS: the control daemon's start and stop lines, and
  ``GpuSliceSpec``, a slice's limits as the container's environment and pipe mount.
- ``docker_host``: ``DockerHost`` (Docker on one machine over the pooled SSH connection),
  ``ContainerState``, why a start failed (``ImageNotOnHost``, ``ContainerDidNotStart``), a
  registry login refused (``RegistryLoginRefused``), the
  tenants' and groups' bridge networks (``NetworkNotIsolated``); pause, unpause, restart and
  commit.
- ``firewall``: the host's tenant firewall (``firewall_ensure``, run with every probe):
  iptables rules, matched on the platform's bridges only (``gpumkt-br*``), that keep rentals
  off the host's own addresses, link-local 169.254.0.0/16 and the provider's named ranges.
- ``volumes``: ``HostVolumes``, volumes whose size the host enforces (a btrfs image of that
  size, loop-mounted under the platform's directory, given to Docker as a local volume), and
  their copy into a clone.
- ``container_files``: files between running containers (``container_copy``, a tar stream
  relayed through the platform) and a container opened to the renter's rsync
  (``rsync_module_open``), for ``vastai copy``.

The SSH errors (``CommandFailed``, ``HostUnreachable``, …) come from ``hosts.ssh``.
"""

from hosts.runtime.container_spec import (
    GPU_UUID,
    PROGRAM_NAME,
    TENANT_NETWORK,
    ContainerSpec,
    InvalidContainerSpec,
    docker_run_argv,
    image_reference,
    validate_env,
    validate_image,
    validate_ports,
)
from hosts.runtime.docker_host import (
    EXIT_DOCKER_ERROR,
    DockerHost,
    ImageNotOnHost,
    RegistryLoginRefused,
)
from hosts.runtime.mps import GpuSliceSpec, mps_daemon_start_argv, mps_daemon_stop_argv
from hosts.runtime.registries import check_registry, image_repository, registry_refusal
from hosts.ssh import CommandFailed, CommandResult, HostKeyMismatch, HostUnreachable

__all__ = [
    "EXIT_DOCKER_ERROR", "GPU_UUID", "PROGRAM_NAME", "TENANT_NETWORK", "CommandFailed",
    "CommandResult", "ContainerSpec", "DockerHost", "GpuSliceSpec", "mps_daemon_start_argv",
    "mps_daemon_stop_argv", "HostKeyMismatch", "HostUnreachable",
    "ImageNotOnHost", "InvalidContainerSpec", "RegistryLoginRefused", "check_registry", "docker_run_argv",
    "image_reference", "image_repository", "registry_refusal", "validate_env", "validate_image",
    "validate_ports",
]  # fmt: skip
