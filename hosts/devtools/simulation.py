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
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SSHD = "/usr/sbin/sshd"
BUSYBOX = "/bin/busybox"
IMAGE = "gpumkt/busybox:latest"
DOCKER_SOCKET = "unix:///var/run/docker.sock"

# A second Docker Engine for hosts that enforce disk sizes (``ensure_quota_dockerd``): its
# btrfs storage driver honours ``--storage-opt size=``, which overlay2 on this machine's
# filesystem cannot (no XFS project quotas in this kernel). The system's engine is never
# touched: this one has its own data root (a loop-mounted btrfs image), sockets, exec root
# and pid file, a default bridge of its own, and leaves iptables alone (a second engine managing
# iptables would flush the first one's DOCKER chains and break its published ports; its
# published ports are served by docker-proxy instead, and its networks come from an address
# pool of their own). Containers on its tenants' bridge are not kept apart by iptables, so
# tenant isolation is tested on the system engine.
QUOTA_DOCKER_SOCKET = "unix:///run/gpumkt-quota-docker.sock"
QUOTA_DOCKER_DIR = Path("/var/lib/gpumkt-quota-docker")
QUOTA_DOCKER_EXEC_ROOT = Path("/run/gpumkt-quota-docker")
QUOTA_DOCKER_PIDFILE = Path("/run/gpumkt-quota-docker.pid")
QUOTA_DOCKER_IMAGE_GB = 16  # sparse: it takes only what the containers write
QUOTA_DOCKER_ADDRESS_POOL = "base=10.213.0.0/16,size=24"
# Its default bridge: one of its own. Not "--bridge none": a dockerd started so deletes the
# host's docker0 (libnetwork's removeDefaultBridgeInterface), the system engine's default
# bridge, and every plain `docker run` there fails until that engine restarts.
QUOTA_DOCKER_BRIDGE = "gpumkt-qd0"
QUOTA_DOCKER_BRIDGE_ADDRESS = "10.214.0.1/24"

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
        pid = _read_pid(self.pid_path)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

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
        pid = _read_pid(self.pid_path)
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
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
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


def ensure_dockerd(log_path: Path | None = None, timeout: float = 60.0) -> None:
    """Start Docker Engine if it is not answering (as root, the way Debian packages it)."""
    if _docker_ready():
        return
    if shutil.which("dockerd") is None:
        raise RuntimeError("dockerd is not installed: apt-get install docker.io")
    log = open(log_path or os.devnull, "ab")  # noqa: SIM115 - handed to the daemon
    subprocess.Popen(
        ["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _docker_ready():
            return
        time.sleep(0.3)
    raise RuntimeError(f"dockerd did not answer within {timeout:.0f}s")


def ensure_quota_dockerd(log_path: Path | None = None, timeout: float = 60.0) -> str:
    """Start the enforced-disk Docker Engine (QUOTA_DOCKER_SOCKET) unless it answers: make
    and loop-mount its btrfs image with quotas on, then run ``dockerd --storage-driver btrfs``
    beside the system's. Idempotent; needs root and btrfs-progs. Returns its socket."""
    if _docker_ready(QUOTA_DOCKER_SOCKET):
        return QUOTA_DOCKER_SOCKET
    for program, package in (("dockerd", "docker.io"), ("mkfs.btrfs", "btrfs-progs")):
        if shutil.which(program) is None:
            raise RuntimeError(f"{program} is not installed: apt-get install {package}")
    image, data = QUOTA_DOCKER_DIR / "btrfs.img", QUOTA_DOCKER_DIR / "data"
    data.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(data):
        if not image.exists():
            with image.open("wb") as handle:
                handle.truncate(QUOTA_DOCKER_IMAGE_GB * 1024**3)
            subprocess.run(["mkfs.btrfs", "-q", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(data)], check=True)
    subprocess.run(["btrfs", "quota", "enable", str(data)], check=True, capture_output=True)
    QUOTA_DOCKER_EXEC_ROOT.mkdir(parents=True, exist_ok=True)
    _ensure_bridge(QUOTA_DOCKER_BRIDGE, QUOTA_DOCKER_BRIDGE_ADDRESS)
    # Its network store starts empty every time: restarted over the store it kept, a dockerd
    # clears the "stale" default bridge network it finds there and deletes the host's docker0
    # with it (measured: a second start removed docker0). Its networks are made again on use.
    shutil.rmtree(data / "network", ignore_errors=True)
    # Pid files left by a dockerd (and its containerd) that died: the machine outlives them,
    # and once their pids are reused by other programs, a daemon that finds one refuses to
    # start, or waits on a containerd that is not there.
    for pidfile, program in (
        (QUOTA_DOCKER_PIDFILE, "dockerd"),
        (QUOTA_DOCKER_EXEC_ROOT / "containerd" / "containerd.pid", "containerd"),
    ):
        if not _runs(_read_pid(pidfile), program):
            pidfile.unlink(missing_ok=True)
    log_path = log_path or QUOTA_DOCKER_DIR / "dockerd.log"
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the daemon
    subprocess.Popen(
        ["dockerd", "--host", QUOTA_DOCKER_SOCKET, "--data-root", str(data),
         "--exec-root", str(QUOTA_DOCKER_EXEC_ROOT), "--pidfile", str(QUOTA_DOCKER_PIDFILE),
         "--storage-driver", "btrfs", "--bridge", QUOTA_DOCKER_BRIDGE, "--iptables=false",
         "--ip-masq=false", "--default-address-pool", QUOTA_DOCKER_ADDRESS_POOL],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _docker_ready(QUOTA_DOCKER_SOCKET):
            return QUOTA_DOCKER_SOCKET
        time.sleep(0.3)
    tail = log_path.read_text(errors="replace").splitlines()[-15:]
    raise RuntimeError(
        f"the enforced-disk dockerd did not answer within {timeout:.0f}s; the end of its log"
        f" ({log_path}):\n" + "\n".join(tail)
    )


def _ensure_bridge(name: str, address: str) -> None:
    """A Linux bridge ``name`` with ``address``, up (made once; kept for the next start)."""
    exists = subprocess.run(["ip", "link", "show", name], capture_output=True, check=False)
    if exists.returncode != 0:
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", address, "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)


def _docker_env(docker_host: str | None) -> dict[str, str] | None:
    return None if docker_host is None else {**os.environ, "DOCKER_HOST": docker_host}


def ensure_image(tag: str = IMAGE, docker_host: str | None = None) -> str:
    """Make the small test image from Debian's static busybox, with no registry. With
    ``docker_host`` (another engine) the image is made on the system's engine and copied
    there (``docker save | docker load``)."""
    if docker_host is not None:
        return _copy_image(ensure_image(tag), docker_host)
    found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    if found.returncode == 0:
        return tag
    if not Path(BUSYBOX).exists():
        raise RuntimeError("busybox is not installed: apt-get install busybox-static")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp, "rootfs")
        for directory in ("bin", "etc", "root", "tmp", "proc", "sys", "dev", "workspace"):
            (rootfs / directory).mkdir(parents=True)
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in applets.stdout.split():
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (rootfs / "etc" / "group").write_text("root:x:0:\n")
        archive = Path(tmp, "rootfs.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        subprocess.run(
            ["docker", "import", "-c", 'CMD ["/bin/sh"]', "-c", "ENV PATH=/bin",
             "-c", "WORKDIR /root", str(archive), tag],
            check=True, capture_output=True,
        )  # fmt: skip
    return tag


# The stand-in for the GPU benchmark image (hosts.benchmark.gpu states the contract): there
# is no GPU to measure, so it says so for each GPU it was given, and the platform records the
# model's typical figures marked simulated.
GPU_BENCH_IMAGE = "gpumkt/gpu-bench-sim:latest"
SIM_GPU_BENCH = """\
# Simulated GPU benchmark: nothing here can run CUDA, so no figure is measured.
for uuid in $(echo "$NVIDIA_VISIBLE_DEVICES" | tr ',' ' '); do
  echo "{\\"uuid\\": \\"$uuid\\", \\"simulated\\": true}"
done
"""


def ensure_gpu_bench_image(
    tag: str = GPU_BENCH_IMAGE, script: str = SIM_GPU_BENCH, docker_host: str | None = None
) -> str:
    """Make a benchmark image whose entrypoint is ``script`` (sh) on the busybox image, with
    no registry: the simulated stand-in by default; tests make failing or slow ones."""
    if docker_host is not None:
        return _copy_image(ensure_gpu_bench_image(tag, script), docker_host)
    found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    if found.returncode == 0:
        return tag
    base = ensure_image()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "gpu-bench").write_text(script)
        Path(tmp, "Dockerfile").write_text(
            f"FROM {base}\nCOPY gpu-bench /bin/gpu-bench\n"
            'ENTRYPOINT ["/bin/sh", "/bin/gpu-bench"]\nCMD []\n'
        )
        subprocess.run(["docker", "build", "-q", "-t", tag, tmp], check=True, capture_output=True)
    return tag


SSH_IMAGE = "gpumkt/sshbox:latest"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
# What the image's sshd reads: keys only, the renter's keys in root's authorized_keys.
SSHBOX_SSHD_CONFIG = """\
Port 22
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
PidFile /run/sshd.pid
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp internal-sftp
"""


def _copy_image(tag: str, docker_host: str) -> str:
    """Copy an image of the system's engine to the engine at ``docker_host`` unless it has it."""
    env = _docker_env(docker_host)
    found = subprocess.run(
        ["docker", "image", "inspect", tag], capture_output=True, check=False, env=env
    )
    if found.returncode == 0:
        return tag
    save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
    subprocess.run(["docker", "load"], stdin=save.stdout, check=True, capture_output=True, env=env)
    if save.wait() != 0:
        raise RuntimeError(f"docker save {tag} failed")
    return tag


def ensure_ssh_image(tag: str = SSH_IMAGE) -> str:
    """Make a small image with a real sshd, with no registry: for SSH launch mode.

    The host's own ``sshd`` and ``ssh-keygen`` with every shared library ``ldd`` lists for
    them, busybox for the shell and tools, and what sshd needs to start: its privilege
    separation user and directory (``/run/sshd``), passwd/group/nsswitch and an sshd_config.
    Host keys are made per container at start (the SSH bootstrap runs ``ssh-keygen -A``).
    Made once and kept, like ``ensure_image``.
    """
    found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    if found.returncode == 0:
        return tag
    for program, package in ((SSHD, "openssh-server"), (SSH_KEYGEN, "openssh-client"),
                             (BUSYBOX, "busybox-static")):  # fmt: skip
        if not Path(program).exists():
            raise RuntimeError(f"{program} is missing: apt-get install {package}")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp, "rootfs")
        for directory in ("bin", "usr/sbin", "usr/bin", "etc/ssh", "root", "tmp", "proc",
                          "sys", "dev", "run/sshd", "var/empty"):  # fmt: skip
            (rootfs / directory).mkdir(parents=True)
        (rootfs / "tmp").chmod(0o1777)
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in applets.stdout.split():
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        for program in (SSHD, SSH_KEYGEN):
            for path in [program, *_shared_libraries(program)]:
                target = rootfs / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)  # follows symlinks: the library itself
        etc = rootfs / "etc"
        (etc / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nsshd:x:102:65534::/run/sshd:/bin/false\n"
        )
        (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\n")
        (etc / "ssh" / "sshd_config").write_text(SSHBOX_SSHD_CONFIG)
        archive = Path(tmp, "rootfs.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        subprocess.run(
            ["docker", "import", "-c", 'CMD ["/bin/sh"]',
             "-c", "ENV PATH=/usr/sbin:/usr/bin:/bin", "-c", "WORKDIR /root", str(archive), tag],
            check=True, capture_output=True,
        )  # fmt: skip
    return tag


def _shared_libraries(program: str) -> list[str]:
    """The absolute paths ``ldd`` lists for a program (its libraries and the loader)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    return [word for line in out.splitlines() for word in line.split() if word.startswith("/")]


def _docker_ready(docker_host: str | None = None) -> bool:
    if shutil.which("docker") is None:
        return False
    result = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        check=False,
        env=_docker_env(docker_host),
    )
    return result.returncode == 0


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True
    )


def _runs(pid: int | None, program: str) -> bool:
    """Whether process ``pid`` is alive and is ``program`` (not another that took its pid)."""
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == program
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


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
