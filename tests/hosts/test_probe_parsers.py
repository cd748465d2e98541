"""The probe reads the real tools' output."""

from __future__ import annotations

import pytest

from hosts.probe import (
    ProbeError,
    parse_cuda_version,
    parse_df_free_gb,
    parse_gpu_csv,
    parse_meminfo_mb,
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
