"""The host CPU's cost model: its pricing, the machine's numbers kept once, and plans of XLA:CPU
modules priced by it (``Options.cost_model="cpu"``), checked against XLA's results."""
import dataclasses
import json
from pathlib import Path

import pytest

import costmodel
from costmodel import KernelProfile
from costmodel.host import HostMachine, HostPricing, bandwidth_for, this_machine
from fusionstitching.codegen.schedules import choose
from fusionstitching.hlo.parser import parse_file
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.runtime.plan_key import options_for, plan_key_of_text

DATA = Path(__file__).parent / "data" / "hlo"
MACHINE = HostMachine(name="test", cores=2, vector_bytes=32,
                      cache_bytes=(32 << 10, 512 << 10, 32 << 20),
                      bandwidth=(100e9, 60e9, 40e9, 15e9))


def profile(elements: int, bytes_moved: int) -> KernelProfile:
    return KernelProfile(grid_blocks=elements, threads_per_block=1, regs_per_thread=0,
                         smem_bytes=0, instructions={"fp32": 2.0, "ld_global": 1.0},
                         bytes_read=bytes_moved // 2, bytes_written=bytes_moved // 2)


def test_bandwidth_is_the_smallest_level_holding_the_working_set():
    assert bandwidth_for(1 << 10, MACHINE) == 100e9
    assert bandwidth_for(200 << 10, MACHINE) == 60e9
    assert bandwidth_for(8 << 20, MACHINE) == 40e9
    assert bandwidth_for(1 << 30, MACHINE) == 15e9


def test_host_pricing_charges_calls_and_work():
    pricing = HostPricing(MACHINE)
    small, large = profile(1024, 8 << 10), profile(1 << 22, 32 << 20)
    assert pricing.kernel_us(small) < pricing.kernel_us(large)
    # a call is the floor of any kernel's time
    assert pricing.kernel_us(small) > costmodel.host.constants().call_us
    # packing: the parts' work in turn under one call
    assert pricing.packed_us([small, small]) == pytest.approx(
        2 * pricing.kernel_us(small) - pricing.launch_us)


def test_the_machine_is_measured_once_and_kept(tmp_path, monkeypatch):
    measured = []

    def measure():
        measured.append(1)
        return dataclasses.replace(MACHINE, name=costmodel.host._processor(),
                                   cores=len(costmodel.host.os.sched_getaffinity(0)))

    monkeypatch.setattr(costmodel.host, "measure_machine", measure)
    this_machine.cache_clear()
    try:
        first = this_machine(str(tmp_path))
        this_machine.cache_clear()  # a new process: read from the file, not measured
        assert this_machine(str(tmp_path)) == first
        assert len(measured) == 1
        kept = json.loads((tmp_path / "host_machine.json").read_text())
        assert kept["bandwidth"] == list(MACHINE.bandwidth)
        (tmp_path / "host_machine.json").write_text("{not json")
        this_machine.cache_clear()
        assert this_machine(str(tmp_path)) == first  # a damaged file is measured again
        assert len(measured) == 2
    finally:
        this_machine.cache_clear()


def test_an_unknown_cost_model_is_a_clear_error():
    module = parse_file(DATA / "layernorm_64x256_jax_cpu.hlo")
    with pytest.raises(ValueError, match="unknown cost model 'tpu'; known: auto, gpu, cpu"):
        stitch_module(module, Options(cost_model="tpu", ptxas=False))


def test_auto_is_the_host_model_on_xla_cpu_and_the_gpus_elsewhere():
    assert options_for(Options(), None).cost_model == "cpu"
    assert options_for(Options(cost_model="gpu"), None).cost_model == "gpu"
    text = (DATA / "layernorm_64x256_jax_cpu.hlo").read_text()
    keys = {plan_key_of_text(text, Options(cost_model=m), True) for m in ("cpu", "gpu")}
    assert len(keys) == 2  # a plan priced by one model is not taken for the other


@pytest.mark.parametrize("name", ["layernorm_64x256_jax_cpu.hlo", "softmax_64x256_jax_cpu.hlo"])
def test_a_normalization_priced_for_the_host_is_one_kernel_that_matches_xla(name):
    result = stitch_module(parse_file(DATA / name),
                           Options(cost_model="cpu", verify=True, host=True, ptxas=False))
    report = result.report
    assert report.target == "cpu"
    assert report.verify.ran and report.verify.ok, report.verify
    assert report.xla.mem_kernels > 1 and report.fs.mem_kernels == 1
    assert report.fs.modeled_us < report.xla.modeled_us
    assert report.fallbacks == []


def test_host_pricing_builds_one_gpu_schedule_a_query(monkeypatch):
    """The GPU schedule of a host-priced pattern is only emulated: the first that builds is
    enough, where the GPU's model builds and prices the candidates to find the fastest."""
    built = []
    real = choose.build_launched

    def counting(*args, **kwargs):
        built.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(choose, "build_launched", counting)
    module = parse_file(DATA / "third_party" / "flax_mlp_mixer_infer_cpu.hlo")
    per_model = {}
    for model in ("gpu", "cpu"):
        built.clear()
        result = stitch_module(module, Options(cost_model=model, ptxas=False, workers=0))
        per_model[model] = (len(built), result.report)
    (gpu_builds, gpu_report), (cpu_builds, cpu_report) = per_model["gpu"], per_model["cpu"]
    assert cpu_builds < gpu_builds / 2, (cpu_builds, gpu_builds)
    assert gpu_report.target == "h100" and cpu_report.target == "cpu"
    assert cpu_report.fs.mem_kernels < cpu_report.xla.mem_kernels
