"""The hardware table (bench/machine/hardware.py) MFU and the plan read: a device name finds its own preset or
datasheet row, never one whose name it merely contains."""
from bench.machine.hardware import PRESETS, match, peak_table
from bench.metrics import flops


def test_each_preset_gpu_resolves_to_its_preset():
    for name, preset in PRESETS.items():
        assert match(preset.gpu) is preset, name
        assert flops.peak_tflops(preset.gpu, "bf16", False) == (preset.peak_tflops["bf16"],
                                                                f"preset {name} bf16/fp16 dense tensor")


def test_names_containing_a_preset_family_get_their_own_row():
    assert peak_table("NVIDIA GH200 480GB")[1] == "datasheet GH200"
    assert peak_table("NVIDIA H100 PCIe") == ({"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}, "datasheet H100 PCIe")
    assert peak_table("NVIDIA H20")[1] == "datasheet H20"
    assert match("NVIDIA A100-PCIE-40GB").name == "a100_40gb"
    assert peak_table("Some Other GPU")[0] is None


def test_a_gpu_without_float8_has_no_fp8_peak():
    peak, source = flops.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8", False)
    assert peak is None and "no fp8" in source
