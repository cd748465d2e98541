"""What makes a machine verified, as a pure decision: the caller hands over what it knows
(the last self-test, the benchmark, the reliability, the thresholds) and gets the verdict and
its reason in words for the machine's page and events."""

from __future__ import annotations

from dataclasses import dataclass

from hosts.benchmark import BenchmarkResult, typical_for


@dataclass(frozen=True)
class Verdict:
    verified: bool
    reason: str


def verdict(
    *,
    self_test_failures: list[str] | None,
    bench: BenchmarkResult | None,
    reliability: float,
    min_reliability: float,
    min_share_of_typical: float,
) -> Verdict:
    """``self_test_failures`` None: the self-test did not run; ``bench`` None: nor the benchmark."""
    if self_test_failures is None:
        return Verdict(False, "the self-test could not run")
    if self_test_failures:
        return Verdict(False, "self-test failed: " + ", ".join(self_test_failures))
    if bench is None or not bench.passed:
        failures = "; ".join(bench.failures) if bench else "it did not run"
        return Verdict(False, f"benchmark failed: {failures}")
    if reliability < min_reliability:
        return Verdict(
            False, f"reliability {reliability:.1%} is below the required {min_reliability:.0%}"
        )
    slow = below_typical(bench, min_share_of_typical)
    if slow:
        return Verdict(False, slow)
    how = " (GPU figures simulated)" if bench.gpu_simulated else ""
    return Verdict(True, f"self-test and benchmark passed{how}")


def below_typical(bench: BenchmarkResult, min_share: float) -> str:
    """Why the measured GPUs fall well below their model's typical figures ('' if they don't)."""
    for gpu in bench.gpus:
        typical = typical_for(gpu.name)
        if typical is None or gpu.simulated:
            continue
        for label, measured, expected in (
            ("FP32 TFLOPS", gpu.fp32_tflops, typical.fp32_tflops),
            ("FP16 TFLOPS", gpu.fp16_tflops, typical.fp16_tflops),
            ("GB/s memory bandwidth", gpu.mem_bw, typical.mem_bw),
        ):
            if measured < expected * min_share:
                return (
                    f"{gpu.uuid} measured {measured:g} {label}, {measured / expected:.0%} of "
                    f"the {expected:g} typical of {gpu.name} (at least {min_share:.0%} needed)"
                )
    return ""
