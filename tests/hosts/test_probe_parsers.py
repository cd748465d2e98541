"""The probe reads the real tools' output."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hosts.ports import pick_free_ports
from hosts.probe import (
    CgroupLimits,
    ProbeError,
    has_nvidia_runtime,
    parse_cgroup_v1,
    parse_cgroup_v2,
    parse_cuda_version,
    parse_df_free_gb,
    parse_df_size_kb,
    parse_gpu_csv,
    parse_meminfo_mb,
    parse_os_release,
)

NVIDIA_SMI_CSV = """0, GPU-3b2996d4-37e5-47a2-8acd-9c047006cd9a, NVIDIA GeForce RTX 4090, 24564, 550.54.14
1, GPU-ce1c4f4e-40fd-4114-a23b-9ca8ef62e2d2, NVIDIA GeForce RTX 4090, 24564, 550.54.14
"""


def test_gpu_csv():
    gpus = parse_gpu_csv(NVIDIA_SMI_CSV)
    assert [(g.index, g.name, g.memory_mib, g.driver_version) for g in gpus] == [
        (0, "NVIDIA GeForce RTX 4090", 24564, "550.54.14"),
        (1, "NVIDIA GeForce RTX 4090", 24564, "550.54.14"),
    ]
    assert gpus[1].uuid == "GPU-ce1c4f4e-40fd-4114-a23b-9ca8ef62e2d2"


@pytest.mark.parametrize(
    "text",
    [
        "0, GPU-x, name, 1",
        "a, GPU-3b2996d4-37e5, n, 1, d",
        "0, not-a-uuid-at-all, n, 1, d",
        "0, GPU-3b2996d4-37e5-47a2-8acd-9c047006cd9a; id, n, 1, d",
        "0, GPU-3b2996d4-37e5, n, lots, d",
    ],
)
def test_gpu_csv_rejects_what_it_cannot_read(text):
    with pytest.raises(ProbeError):
        parse_gpu_csv(text)


def test_cuda_meminfo_df():
    assert (
        parse_cuda_version(
            "| NVIDIA-SMI 550.54.14   Driver Version: 550.54.14   CUDA Version: 12.4 |"
        )
        == "12.4"
    )
    assert parse_meminfo_mb("MemTotal:       24573452 kB\nMemFree: 1 kB\n") == 23997
    df = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n/dev/vda  263174212 22000000 83886080  22% /\n"
    assert parse_df_free_gb(df) == 80


def test_cgroup_v2_limits():
    limits = parse_cgroup_v2("50000 100000\n134217728\n")
    assert limits == CgroupLimits(cpus=0.5, memory_bytes=128 * 1024 * 1024)
    assert parse_cgroup_v2("max 100000\nmax\n") == CgroupLimits(cpus=None, memory_bytes=None)


def test_cgroup_v1_limits():
    assert parse_cgroup_v1("150000\n100000\n268435456\n") == CgroupLimits(1.5, 256 << 20)
    # v1 says "no limit" with -1 and a huge page-aligned number.
    assert parse_cgroup_v1("-1\n100000\n9223372036854771712\n") == CgroupLimits(None, None)


@pytest.mark.parametrize("text", ["", "max", "x 100000\nmax", "50000 100000\n12k"])
def test_cgroup_text_that_is_not_understood_is_an_error(text):
    with pytest.raises(ProbeError):
        parse_cgroup_v2(text)


def test_df_size_busybox_and_gnu():
    busybox = "Filesystem           1K-blocks      Used Available Use% Mounted on\nshm                      32768         0     32768   0% /dev/shm\n"
    assert parse_df_size_kb(busybox) == 32768
    with pytest.raises(ProbeError):
        parse_df_size_kb("df: /dev/shm: No such file or directory")


def test_nvidia_runtime_is_read_from_docker_infos_runtimes():
    # As `docker info --format '{{json .}}'` prints them on a host with and without the NVIDIA
    # Container Toolkit configured.
    with_toolkit = {
        "ServerVersion": "27.3.1",
        "Runtimes": {
            "io.containerd.runc.v2": {"path": "runc"},
            "nvidia": {"path": "nvidia-container-runtime"},
            "runc": {"path": "runc"},
        },
        "DefaultRuntime": "runc",
    }
    without = {"ServerVersion": "20.10.24", "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}}  # fmt: skip
    assert has_nvidia_runtime(with_toolkit) is True
    assert has_nvidia_runtime(without) is False
    assert has_nvidia_runtime({"Runtimes": None}) is False
    assert has_nvidia_runtime({"Runtimes": ["nvidia"]}) is False  # not the shape docker prints


def test_os_release():
    text = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
    assert parse_os_release(text) == "Debian GNU/Linux 12 (bookworm)"


@pytest.mark.parametrize(
    ("start", "end", "used", "count", "expected"),
    [
        (20000, 20004, set(), 2, [20000, 20001]),
        (20000, 20004, {20000, 20002}, 2, [20001, 20003]),
        (20000, 20002, {20000, 20001, 20002}, 1, []),
        (20000, 20002, {20001}, 5, [20000, 20002]),  # fewer when the range is full
        (20000, 20002, set(), 0, []),
    ],
)
def test_pick_free_ports(start, end, used, count, expected):
    assert pick_free_ports(start, end, used, count) == expected


@pytest.mark.parametrize(
    ("info", "options", "enforced"),
    [
        ({"Driver": "btrfs"}, "rw,relatime,space_cache=v2", True),
        # overlay2 caps a container's layer only over XFS mounted with project quotas.
        (
            {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]},
            "rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,prjquota",
            True,
        ),
        (
            {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]},
            "rw,relatime,attr2,inode64,pqnoenforce",
            False,
        ),
        (
            {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]},
            "rw,relatime,attr2,inode64,noquota",
            False,
        ),
        ({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}, "rw", False),
        ({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]}, None, False),
        ({"Driver": "vfs"}, "rw", False),
    ],
)
def test_which_docker_hosts_can_cap_a_containers_disk(info, options, enforced):
    from hosts.probe import storage_quota_supported

    assert storage_quota_supported(info, options) is enforced


def test_pick_free_ports_rests_ports_given_back():
    now = datetime(2026, 12, 7, tzinfo=UTC)
    resting = {20000: now, 20002: now - timedelta(minutes=5), 20009: now}  # 20009: out of range
    # Free ports that are not resting first, lowest first; then resting ones, longest rested
    # first; a resting port that is live again (used) is not free.
    assert pick_free_ports(20000, 20003, {20001}, 1, resting) == [20003]
    assert pick_free_ports(20000, 20003, {20001}, 3, resting) == [20003, 20002, 20000]
    assert pick_free_ports(20000, 20003, {20001, 20002}, 4, resting) == [20003, 20000]
