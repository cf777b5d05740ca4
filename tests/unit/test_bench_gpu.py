"""The GPU beside a bench run: nvidia-smi's lines read as the node's memory and mean
utilisation (literal outputs of one and of two GPUs, and of a board that reports N/A)."""

from __future__ import annotations

from edge_vision.tools.bench.gpu import GpuSampler, parse_smi


def test_the_nodes_gpu_memory_is_the_sum_and_utilisation_the_mean() -> None:
    assert parse_smi("9216, 91\n") == (9216.0, 91.0)
    assert parse_smi("9216, 91\n4096, 49\n") == (13312.0, 70.0)


def test_what_does_not_parse_is_no_sample() -> None:
    assert parse_smi("") is None
    assert parse_smi("[N/A], [N/A]\n") is None
    assert parse_smi("NVIDIA-SMI has failed because it couldn't communicate\n") is None


def test_without_nvidia_smi_a_run_gets_no_gpu_fields() -> None:
    sampler = GpuSampler(smi=None)
    sampler.smi = None  # as on a machine without the NVIDIA driver
    sampler.sample()
    assert sampler.stop() == {}
