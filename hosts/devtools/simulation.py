"""Simulated hosts: everything real except the GPUs.

Each simulated host is a real ``sshd`` on its own loopback address and port, with its own host
key and ``authorized_keys``. Its sessions get ``PATH`` and ``DOCKER_HOST`` through ``SetEnv``, so
``docker`` reaches the one real Docker Engine on this machine, and ``nvidia-smi`` is a small
per-host script that prints that host's configured GPUs in the real tool's CSV format. A small
image (``gpumkt/busybox``) is made without any registry: Debian's static busybox as a rootfs,
``docker import``-ed.

Development and test tooling, never imported by production code: used by ``manage.py
simhosts`` (and so ``make run``), ``scripts/services.sh``, the benches and the test fixtures.
Needs root (sshd must switch to the login user), ``/usr/sbin/sshd``, ``dockerd`` and
``/bin/busybox``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hosts.devtools.sim_docker import DOCKER_SOCKET, SSHD, read_pid

# The columns the stand-in can print, in the real tool's query names and header units.
NVIDIA_SMI_FIELDS = {
    "index": "",
    "uuid": "",
    "name": "",
    "memory.total": "MiB",
    "memory.used": "MiB",
    "driver_version": "",
    "utilization.gpu": "%",
    "temperature.gpu": "",
    "pci.bus_id": "",
}


# Simulated GPU UUIDs are derived from the host's name and the GPU's index, so a host made
# again (every `make run`, every test session) reports the same GPUs: a re-probe finds the
# GPUs it knows instead of marking them missing and adding new rows, and allocations keep
# pointing at GPUs that exist.
_SIM_GPU_NAMESPACE = uuid.UUID("6f0d2a52-6c1e-4c57-9a51-9b7c3f1d2e80")


def sim_gpu_uuid(host_name: str, index: int) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (nvidia-smi's form), the same every time
    for the same host name and index."""
    return f"GPU-{uuid.uuid5(_SIM_GPU_NAMESPACE, f'{host_name}/{index}')}"


@dataclass(frozen=True)
class SimGpu:
    index: int
    name: str = "NVIDIA GeForce RTX 4090"
    memory_mib: int = 24564
    uuid: str = ""  # empty: derived from the host's name and the index (sim_gpu_uuid)
    driver_version: str = "550.54.14"


@dataclass(frozen=True)
class SimHostSpec:
    name: str
    address: str
    port: int
    gpus: tuple[SimGpu, ...]
    cuda_version: str = "12.4"
    port_range: tuple[int, int] = (20000, 20999)
    mps: bool = True  # ships the CUDA MPS control daemon (a stand-in), so sharing can be on
    # The Docker Engine its sessions reach: the system's, or QUOTA_DOCKER_SOCKET for a host
    # that enforces disk sizes (``ensure_quota_dockerd`` must have started it).
    docker_host: str = DOCKER_SOCKET

    def __post_init__(self) -> None:
        gpus = tuple(
            gpu if gpu.uuid else replace(gpu, uuid=sim_gpu_uuid(self.name, gpu.index))
            for gpu in self.gpus
        )
        object.__setattr__(self, "gpus", gpus)  # frozen: set once, here


@dataclass
class SimHost:
    spec: SimHostSpec
    root: Path
    user: str = "root"

    @property
    def address(self) -> str:
        return self.spec.address

    @property
    def port(self) -> int:
        return self.spec.port

    @property
    def host_key_path(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def host_public_key(self) -> str:
        """``ssh-ed25519 AAAA…`` as a provider would read it from the machine."""
        return " ".join(self.host_key_path.with_suffix(".pub").read_text().split()[:2])

    @property
    def host_key_fingerprint(self) -> str:
        """``SHA256:…``, the same as ``ssh-keygen -lf`` prints."""
        blob = base64.b64decode(self.host_public_key.split()[1])
        digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
        return f"SHA256:{digest}"

    @property
    def authorized_keys_path(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def pid_path(self) -> Path:
        return self.root / "sshd.pid"

    @property
    def gpus_path(self) -> Path:
        return self.root / "gpus.json"

    def authorize(self, public_key: str) -> None:
        """Add a public key to this host's ``authorized_keys`` (as a provider would)."""
        authorize_key(self.root, public_key)

    def set_gpus(self, gpus: tuple[SimGpu, ...]) -> None:
        """Change what ``nvidia-smi`` reports (a GPU falling off the bus, say)."""
        self.gpus_path.write_text(json.dumps([asdict(gpu) for gpu in gpus]))
        _write_gpu_table(self.root, gpus)

    @property
    def driver_failure_path(self) -> Path:
        return self.root / "nvidia-driver-failed"

    def set_driver_failed(self, failed: bool) -> None:
        """Make ``nvidia-smi`` fail the way it does when it cannot talk to the driver."""
        if failed:
            self.driver_failure_path.touch()
        else:
            self.driver_failure_path.unlink(missing_ok=True)

    def is_running(self) -> bool:
        pid = read_pid(self.pid_path)
        return pid is not None and _alive(pid)

    def start(self, timeout: float = 10.0) -> None:
        if self.is_running():
            return
        subprocess.run(
            [SSHD, "-f", str(self.root / "sshd_config"), "-E", str(self.root / "sshd.log")],
            check=True,
        )
        _wait_for_port(self.address, self.port, timeout)

    def stop(self) -> None:
        """Stop the host like a power cut: the listener and every open session end."""
        pid = read_pid(self.pid_path)
        if pid is None:
            return
        for child in _descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        self.pid_path.unlink(missing_ok=True)

    def rotate_host_key(self) -> None:
        """Give the host a new key (a reinstalled or impersonated machine)."""
        self.host_key_path.unlink()
        self.host_key_path.with_suffix(".pub").unlink()
        _keygen(self.host_key_path)
        if self.is_running():
            self.stop()
            self.start()

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.spec.name,
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "gpus": [asdict(gpu) for gpu in self.spec.gpus],
            "port_range": list(self.spec.port_range),
            "host_key": self.host_public_key,
            "fingerprint": self.host_key_fingerprint,
            "root": str(self.root),
        }


def authorize_key(root: Path, public_key: str) -> None:
    """Add a public key to the ``authorized_keys`` of the host made under ``root``."""
    path = root / "authorized_keys"
    existing = path.read_text() if path.exists() else ""
    if public_key.strip() not in existing.splitlines():
        with path.open("a") as handle:
            handle.write(public_key.strip() + "\n")


def default_gpus(count: int, name: str = "NVIDIA GeForce RTX 4090", memory_mib: int = 24564):
    """``count`` GPUs; their UUIDs come from the host's name once they are in a SimHostSpec."""
    return tuple(SimGpu(index=i, name=name, memory_mib=memory_mib) for i in range(count))


def create_host(root: Path, spec: SimHostSpec, authorized_keys: list[str] = ()) -> SimHost:
    """Write the host's files (keys, config, ``nvidia-smi``) and start its sshd."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(exist_ok=True)
    host = SimHost(spec=spec, root=root)
    if not host.host_key_path.exists():
        _keygen(host.host_key_path)
    host.authorized_keys_path.touch()
    for key in authorized_keys:
        host.authorize(key)
    host.set_gpus(spec.gpus)
    _write_nvidia_smi(root, spec)
    _write_mps_control(root, spec)
    _write_sshd_config(root, spec)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    host.start()
    return host


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A daemon's parent is init, which may reap it seconds after
    it exits (this machine's init does, about 2 s later): until then it is a zombie that
    ``kill(pid, 0)`` still finds, so a zombie counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """Processes below ``pid`` (sshd forks one per connection), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    stack = list(parents.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(parents.get(child, []))
    return found[::-1]


def _wait_for_port(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not start within {timeout:.0f}s")


def _write_sshd_config(root: Path, spec: SimHostSpec) -> None:
    path_env = f"{root / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    (root / "sshd_config").write_text(
        "\n".join(
            [
                f"ListenAddress {spec.address}:{spec.port}",
                f"HostKey {root / 'ssh_host_ed25519_key'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                f"PidFile {root / 'sshd.pid'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "MaxSessions 64",
                "MaxStartups 64:30:128",
                "ClientAliveInterval 30",
                # Per-host environment: this host's nvidia-smi first on PATH, the shared engine.
                # SHLVL=1 tells bash it is not sshd's first shell, so it skips the login user's
                # ~/.bashrc (on this image it runs `pyenv init`, a slow start for every
                # command), as a
                # real host's non-interactive shell would.
                f"SetEnv PATH={path_env} DOCKER_HOST={spec.docker_host} "
                f"GPUMKT_SIMULATED_HOST={spec.name} SHLVL=1",
                "",
            ]
        )
    )


def _write_gpu_table(root: Path, gpus: tuple[SimGpu, ...]) -> None:
    # One tab-separated line per GPU, in the column order of NVIDIA_SMI_FIELDS.
    lines = []
    for gpu in gpus:
        values = {
            "index": str(gpu.index),
            "uuid": gpu.uuid,
            "name": gpu.name,
            "memory.total": str(gpu.memory_mib),
            "memory.used": "0",
            "driver_version": gpu.driver_version,
            "utilization.gpu": "0",
            "temperature.gpu": "34",
            "pci.bus_id": f"00000000:{gpu.index + 1:02X}:00.0",
        }
        lines.append("\t".join(values[name] for name in NVIDIA_SMI_FIELDS))
    (root / "gpus.tsv").write_text("".join(line + "\n" for line in lines))


def _write_mps_control(root: Path, spec: SimHostSpec) -> None:
    """The stand-in for ``nvidia-cuda-mps-control``: ``-d`` starts "the daemon" (a file naming
    the pipe and log directories it was given, which it creates as the real one does); on
    stdin it takes ``get_server_list`` (fails when no daemon runs, as the real client does)
    and ``quit``. Every call is logged to ``mps/calls`` for the tests to read."""
    path = root / "bin" / "nvidia-cuda-mps-control"
    if not spec.mps:
        path.unlink(missing_ok=True)
        return
    state = root / "mps"
    script = f"""#!/bin/sh
# Simulated nvidia-cuda-mps-control for host {spec.name}.
STATE="{state}"
mkdir -p "$STATE"
echo "$* pipe=${{CUDA_MPS_PIPE_DIRECTORY:-}} log=${{CUDA_MPS_LOG_DIRECTORY:-}}" >> "$STATE/calls"
if [ "$1" = "-d" ]; then
  if [ -e "$STATE/daemon" ]; then
    echo "An instance of this daemon is already running" >&2; exit 1
  fi
  mkdir -p "${{CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}}" "${{CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}}"
  echo "pipe=${{CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}}" > "$STATE/daemon"
  exit 0
fi
if [ ! -e "$STATE/daemon" ]; then
  echo "Cannot find MPS control daemon process" >&2; exit 1
fi
while read -r command rest; do
  case "$command" in
    get_server_list) ;;
    quit) rm -f "$STATE/daemon" ;;
    *) echo "Unknown command: $command" >&2 ;;
  esac
done
exit 0
"""
    path.write_text(script)
    path.chmod(0o755)


def _write_nvidia_smi(root: Path, spec: SimHostSpec) -> None:
    """The stand-in for ``nvidia-smi``: real CSV output for the query forms we use."""
    columns = " ".join(NVIDIA_SMI_FIELDS)
    units = " ".join(f"{name}={unit}" for name, unit in NVIDIA_SMI_FIELDS.items() if unit)
    script = f"""#!/bin/sh
# Simulated nvidia-smi for host {spec.name}: prints the GPUs in {root}/gpus.tsv.
TABLE="{root}/gpus.tsv"
if [ -e "{root}/nvidia-driver-failed" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
COLUMNS="{columns}"
UNITS="{units}"
query=""; header=1; units=1; list=0
for arg in "$@"; do
  case "$arg" in
    --query-gpu=*) query="${{arg#--query-gpu=}}" ;;
    --format=*) fmt="${{arg#--format=}}"
      case ",$fmt," in *,noheader,*) header=0 ;; esac
      case ",$fmt," in *,nounits,*) units=0 ;; esac ;;
    -L|--list-gpus) list=1 ;;
    *) echo "Invalid combination of input arguments: $arg" >&2; exit 2 ;;
  esac
done
if [ "$list" = 1 ]; then
  awk -F '\\t' '{{ printf "GPU %s: %s (UUID: %s)\\n", $1, $3, $2 }}' "$TABLE"; exit 0
fi
if [ -z "$query" ]; then
  driver=$(awk -F '\\t' 'NR==1{{print $6}}' "$TABLE")
  echo "+-----------------------------------------------------------------------------------------+"
  echo "| NVIDIA-SMI $driver              Driver Version: $driver      CUDA Version: {spec.cuda_version}     |"
  echo "+-----------------------------------------------------------------------------------------+"
  awk -F '\\t' '{{ printf "| %3s  %-40s %8s MiB |\\n", $1, $3, $4 }}' "$TABLE"
  exit 0
fi
awk -F '\\t' -v query="$query" -v columns="$COLUMNS" -v unitspec="$UNITS" \\
    -v header="$header" -v units="$units" '
BEGIN {{
  n = split(columns, names, " "); for (i = 1; i <= n; i++) position[names[i]] = i
  m = split(unitspec, pairs, " "); for (i = 1; i <= m; i++) {{ split(pairs[i], kv, "="); unit[kv[1]] = kv[2] }}
  q = split(query, wanted, ",")
  for (i = 1; i <= q; i++) if (!(wanted[i] in position)) {{
    printf "Field \\"%s\\" is not a valid field to query.\\n", wanted[i] > "/dev/stderr"; bad = 1; exit 2
  }}
  if (header) {{
    line = ""
    for (i = 1; i <= q; i++) {{
      h = wanted[i]; if (units && unit[h] != "") h = h " [" unit[h] "]"
      line = line (i > 1 ? ", " : "") h
    }}
    print line
  }}
}}
{{
  line = ""
  for (i = 1; i <= q; i++) {{
    v = $(position[wanted[i]]); if (units && unit[wanted[i]] != "") v = v " " unit[wanted[i]]
    line = line (i > 1 ? ", " : "") v
  }}
  print line
}}
END {{ if (bad) exit 2 }}' "$TABLE"
"""
    path = root / "bin" / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)
