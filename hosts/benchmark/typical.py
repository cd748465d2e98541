"""Typical figures of GPU models, from their vendors' data sheets: what a healthy card of the
model delivers. Verification compares measured figures with them, and the simulated hosts'
stand-in GPUs report them (marked simulated) because nothing there can be measured.

``fp32_tflops`` is dense FP32 (non-tensor), ``fp16_tflops`` dense FP16 tensor-core throughput
with FP32 accumulate (what mixed-precision training uses), ``mem_bw`` the memory bandwidth in
GB/s, ``compute_cap`` the CUDA compute capability × 100 (8.9 → 890, as vast.ai writes it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TypicalFigures:
    compute_cap: int
    fp32_tflops: float
    fp16_tflops: float
    mem_bw: float


# Longest names first where one contains another (e.g. "A100 80GB PCIe" before "A100").
TYPICAL: dict[str, TypicalFigures] = {
    "H200": TypicalFigures(900, 67.0, 989.0, 4800.0),
    "H100 PCIe": TypicalFigures(900, 51.2, 756.0, 2000.0),
    "H100": TypicalFigures(900, 67.0, 989.0, 3350.0),
    "A100-SXM4-80GB": TypicalFigures(800, 19.5, 312.0, 2039.0),
    "A100 80GB PCIe": TypicalFigures(800, 19.5, 312.0, 1935.0),
    "A100": TypicalFigures(800, 19.5, 312.0, 1555.0),
    "L40S": TypicalFigures(890, 91.6, 362.0, 864.0),
    "L40": TypicalFigures(890, 90.5, 181.0, 864.0),
    "L4": TypicalFigures(890, 30.3, 121.0, 300.0),
    "A10": TypicalFigures(860, 31.2, 125.0, 600.0),
    "RTX A6000": TypicalFigures(860, 38.7, 154.8, 768.0),
    "RTX 6000 Ada": TypicalFigures(890, 91.1, 364.0, 960.0),
    "RTX 4090": TypicalFigures(890, 82.6, 165.2, 1008.0),
    "RTX 4080": TypicalFigures(890, 48.7, 97.5, 717.0),
    "RTX 3090": TypicalFigures(860, 35.6, 71.0, 936.0),
    "RTX 3080": TypicalFigures(860, 29.8, 59.5, 760.0),
    "V100": TypicalFigures(700, 15.7, 125.0, 900.0),
    "T4": TypicalFigures(750, 8.1, 65.0, 320.0),
}


def typical_for(gpu_name: str) -> TypicalFigures | None:
    """The typical figures of a GPU by nvidia-smi's name ("NVIDIA GeForce RTX 4090"), or None
    for a model not in the table (then nothing is simulated or compared for it)."""
    name = gpu_name.upper()
    for model in sorted(TYPICAL, key=len, reverse=True):
        if model.upper() in name:
            return TYPICAL[model]
    return None
