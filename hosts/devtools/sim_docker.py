"""The Docker side of the simulated hosts: the engines they reach and the images they run.

The one real Docker Engine on this machine (``ensure_dockerd``), a second one whose storage
driver enforces disk sizes (``ensure_quota_dockerd``), and the small images made without any
registry: busybox as a rootfs (``ensure_image``), an image with sshd (``ensure_ssh_image``) and
the stand-in GPU benchmark (``ensure_gpu_bench_image``). Development and test tooling, never
imported by production code (``hosts.devtools.simulation`` says how the hosts themselves run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
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
        if not process_runs(read_pid(pidfile), program):
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
RSYNC = "/usr/bin/rsync"
# Bumped when the image gains a program, so an image kept from before is made again.
SSH_IMAGE_VERSION = "2"  # 2: rsync, for `vastai copy`
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

    The host's own ``sshd``, ``ssh-keygen`` and ``rsync`` (what ``vastai copy`` runs at both
    ends) with every shared library ``ldd`` lists for them, busybox for the shell and tools,
    and what sshd needs to start: its privilege separation user and directory (``/run/sshd``),
    passwd/group/nsswitch and an sshd_config. Host keys are made per container at start (the
    SSH bootstrap runs ``ssh-keygen -A``). Made once and kept, like ``ensure_image``, until
    ``SSH_IMAGE_VERSION`` changes.
    """
    found = subprocess.run(
        ["docker", "image", "inspect", "--format", '{{index .Config.Labels "gpumkt.sshbox"}}', tag],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode == 0 and found.stdout.strip() == SSH_IMAGE_VERSION:
        return tag
    for program, package in ((SSHD, "openssh-server"), (SSH_KEYGEN, "openssh-client"),
                             (BUSYBOX, "busybox-static"), (RSYNC, "rsync")):  # fmt: skip
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
        for program in (SSHD, SSH_KEYGEN, RSYNC):
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
             "-c", "ENV PATH=/usr/sbin:/usr/bin:/bin", "-c", "WORKDIR /root",
             "-c", f"LABEL gpumkt.sshbox={SSH_IMAGE_VERSION}", str(archive), tag],
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


def process_runs(pid: int | None, program: str) -> bool:
    """Whether process ``pid`` is alive and is ``program`` (not another that took its pid)."""
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == program
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
