"""The benchmark's pure parts: the GPU image's contract, typical figures, the dlperf score."""

from __future__ import annotations

import pytest

from hosts.benchmark import GpuBenchFailed, dlperf_per_gpu, parse_gpu_bench, typical_for

GPUS = {"GPU-a": "NVIDIA GeForce RTX 4090", "GPU-b": "NVIDIA GeForce RTX 4090"}


def test_measured_lines_are_read_and_other_output_ignored():
    output = (
        "warming up…\n"
        '{"uuid": "GPU-a", "compute_cap": "8.9", "fp32_tflops": 80.1, "fp16_tflops": 160,'
        ' "mem_bw": 950, "simulated": false}\n'
        '{"uuid": "GPU-b", "compute_cap": 8.9, "fp32_tflops": 79.9, "fp16_tflops": 159.5,'
        ' "mem_bw": 949.5}\n'
    )
    a, b = parse_gpu_bench(output, GPUS)
    assert (a.uuid, a.compute_cap, a.fp32_tflops, a.simulated) == ("GPU-a", 890, 80.1, False)
    assert (b.uuid, b.mem_bw) == ("GPU-b", 949.5)


def test_a_simulated_gpu_reports_its_models_typical_figures_marked():
    output = '{"uuid": "GPU-a", "simulated": true}\n{"uuid": "GPU-b", "simulated": true}\n'
    a, _ = parse_gpu_bench(output, GPUS)
    assert a.simulated is True
    assert (a.fp32_tflops, a.fp16_tflops, a.mem_bw, a.compute_cap) == (82.6, 165.2, 1008.0, 890)


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ('{"uuid": "GPU-a", "simulated": true}\n', "reported nothing for GPU-b"),
        (
            '{"uuid": "GPU-a", "fp32_tflops": -1, "fp16_tflops": 1, "mem_bw": 1}\n'
            '{"uuid": "GPU-b", "simulated": true}\n',
            "GPU-a: fp32_tflops is not a positive number (-1)",
        ),
        (
            '{"uuid": "GPU-a", "fp32_tflops": true, "fp16_tflops": 1, "mem_bw": 1}\n'
            '{"uuid": "GPU-b", "simulated": true}\n',
            "fp32_tflops is not a positive number (True)",
        ),
    ],
)
def test_output_that_breaks_the_contract_fails_the_run(output, says):
    with pytest.raises(GpuBenchFailed, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_gpu_bench(output, GPUS)


def test_a_simulated_gpu_of_an_unknown_model_fails_rather_than_inventing_figures():
    with pytest.raises(GpuBenchFailed, match="no typical figures"):
        parse_gpu_bench('{"uuid": "GPU-x", "simulated": true}', {"GPU-x": "Mystery GPU 9000"})


def test_typical_figures_match_the_most_specific_model_name():
    assert typical_for("NVIDIA H100 PCIe").mem_bw == 2000.0
    assert typical_for("NVIDIA H100 80GB HBM3").mem_bw == 3350.0
    assert typical_for("NVIDIA A100-SXM4-80GB").mem_bw == 2039.0
    assert typical_for("NVIDIA L40S").fp32_tflops == 91.6
    assert typical_for("Mystery GPU 9000") is None


def test_dlperf_weighs_compute_and_bandwidth_and_a_slow_disk_costs_at_most_a_fifth():
    fast = dlperf_per_gpu(fp16_tflops=165.2, mem_bw=1008, disk_read_mbps=1500)
    assert fast == round(0.6 * 165.2 + 0.4 * 100.8, 2) == 139.44
    starved = dlperf_per_gpu(fp16_tflops=165.2, mem_bw=1008, disk_read_mbps=0)
    assert starved == round(fast * 0.8, 2)
