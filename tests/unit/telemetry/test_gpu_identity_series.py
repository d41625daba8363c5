"""Matching torch's CUDA devices to NVML's GPUs by UUID, and the series built from it: the
``memprof_cuda_device_info`` mapping, MIG memory and torch's reserved bytes per GPU (pure)."""
from __future__ import annotations

from memprof_otel.metric_names import BY_PROM
from memprof_otel.telemetry.gpu_identity import CudaDeviceIdentity, identify, normalize_uuid
from memprof_otel.telemetry.series import SelfView, build_series
from memprof_otel.timeline import GpuReading, MigReading, Sample

GIB = 1 << 30
HEX_A = "16aa0000-1111-2222-3333-444444444444"
HEX_B = "80bb0000-5555-6666-7777-888888888888"
HEX_M = "10cc0000-9999-aaaa-bbbb-cccccccccccc"


def gpu(index: int, hex_: str, total: int, migs: tuple[MigReading, ...] = (),
        process: int | None = None) -> GpuReading:
    return GpuReading(index, f"GPU-{hex_}", "NVIDIA H100", "550.54.15", used_bytes=total // 2,
                      total_bytes=total, process_used_bytes=process, migs=migs)


def test_uuid_forms_of_torch_and_nvml_compare_equal() -> None:
    assert normalize_uuid(f"GPU-{HEX_A}") == normalize_uuid(HEX_A.upper()) == HEX_A
    assert normalize_uuid(f"MIG-{HEX_M}") == HEX_M


def test_remapped_cuda_visible_devices_map_by_uuid_not_by_index() -> None:
    # CUDA_VISIBLE_DEVICES=1,0: torch's cuda:0 is NVML's gpu 1
    gpus = [gpu(0, HEX_A, 16 * GIB), gpu(1, HEX_B, 80 * GIB)]
    assert identify({0: HEX_B, 1: HEX_A}, gpus) == [
        CudaDeviceIdentity("cuda:0", "1", f"GPU-{HEX_B}"),
        CudaDeviceIdentity("cuda:1", "0", f"GPU-{HEX_A}")]


def test_a_mig_device_maps_to_its_parent_and_instance() -> None:
    mig = MigReading(f"MIG-{HEX_M}", gpu_instance_id=3, compute_instance_id=0, used_bytes=1, total_bytes=10 * GIB)
    (ident,) = identify({0: HEX_M}, [gpu(0, HEX_B, 40 * GIB, migs=(mig,))])
    assert ident == CudaDeviceIdentity("cuda:0", "0", f"GPU-{HEX_B}", f"MIG-{HEX_M}", "3")


def test_a_device_nvml_does_not_show_keeps_torchs_uuid_unmatched() -> None:
    (ident,) = identify({0: HEX_A}, [])
    assert ident == CudaDeviceIdentity("cuda:0", "", f"GPU-{HEX_A}") and not ident.matched


def rows(series: dict, name: str) -> list[tuple[dict, float]]:
    return series.get(name, [])


def test_series_join_torch_devices_to_gpus_in_our_and_dcgm_label_names() -> None:
    # GIVEN two torch devices, remapped, with reserved bytes, and NVML unable to see our PID
    sample = Sample(t=1.0, process={}, allocators={
        "cuda:0": {"reserved_bytes": 6 * GIB, "allocated_bytes": 5 * GIB},
        "cuda:1": {"reserved_bytes": 2 * GIB, "allocated_bytes": 1 * GIB}},
        gpus=(gpu(0, HEX_A, 16 * GIB), gpu(1, HEX_B, 80 * GIB)))
    s = build_series(sample, [], SelfView(cuda_uuids={0: HEX_B, 1: HEX_A}))

    # THEN the mapping series names each device's GPU by index (ours) and UUID (both spellings)
    info = sorted(rows(s, "memprof_cuda_device_info"), key=lambda r: r[0]["device"])
    assert info == [
        ({"device": "cuda:0", "gpu": "1", "gpu_uuid": f"GPU-{HEX_B}", "UUID": f"GPU-{HEX_B}",
          "mig_uuid": "", "GPU_I_ID": ""}, 1.0),
        ({"device": "cuda:1", "gpu": "0", "gpu_uuid": f"GPU-{HEX_A}", "UUID": f"GPU-{HEX_A}",
          "mig_uuid": "", "GPU_I_ID": ""}, 1.0)]
    assert set(info[0][0]) == set(BY_PROM["memprof_cuda_device_info"].labels)
    # AND torch's reserved bytes stand in per GPU, while the NVML figure is absent (unknown)
    assert sorted(rows(s, "memprof_gpu_process_torch_reserved_bytes"), key=lambda r: r[0]["gpu"]) == [
        ({"gpu": "0", "gpu_uuid": f"GPU-{HEX_A}"}, float(2 * GIB)),
        ({"gpu": "1", "gpu_uuid": f"GPU-{HEX_B}"}, float(6 * GIB))]
    assert rows(s, "memprof_gpu_process_memory_used_bytes") == []


def test_mig_series_carry_the_instance_identity_and_the_fallback_goes_to_the_parent() -> None:
    mig = MigReading(f"MIG-{HEX_M}", gpu_instance_id=3, compute_instance_id=1, used_bytes=4 * GIB,
                     total_bytes=10 * GIB)
    sample = Sample(t=1.0, process={}, allocators={"cuda:0": {"reserved_bytes": 3 * GIB}},
                    gpus=(gpu(0, HEX_B, 40 * GIB, migs=(mig,), process=5 * GIB),))
    s = build_series(sample, [], SelfView(cuda_uuids={0: HEX_M}))
    lab = {"gpu": "0", "gpu_uuid": f"GPU-{HEX_B}", "mig_uuid": f"MIG-{HEX_M}", "gpu_instance_id": "3",
           "compute_instance_id": "1"}
    assert rows(s, "memprof_gpu_mig_memory_used_bytes") == [(lab, float(4 * GIB))]
    assert rows(s, "memprof_gpu_mig_memory_total_bytes") == [(lab, float(10 * GIB))]
    assert rows(s, "memprof_cuda_device_info")[0][0]["GPU_I_ID"] == "3"
    assert rows(s, "memprof_gpu_process_torch_reserved_bytes") == [
        ({"gpu": "0", "gpu_uuid": f"GPU-{HEX_B}"}, float(3 * GIB))]
    assert rows(s, "memprof_gpu_process_memory_used_bytes") == [
        ({"gpu": "0", "gpu_uuid": f"GPU-{HEX_B}"}, float(5 * GIB))]


def test_no_cuda_uuids_no_identity_series() -> None:
    sample = Sample(t=1.0, process={}, gpus=(gpu(0, HEX_A, 16 * GIB, process=0),))
    s = build_series(sample, [], SelfView())
    assert rows(s, "memprof_cuda_device_info") == []
    assert rows(s, "memprof_gpu_process_torch_reserved_bytes") == []


def test_without_nvml_the_mapping_keeps_torchs_uuid_and_no_fallback_is_guessed() -> None:
    sample = Sample(t=1.0, process={}, allocators={"cuda:0": {"reserved_bytes": 1 * GIB}})
    s = build_series(sample, [], SelfView(cuda_uuids={0: HEX_A}))
    assert rows(s, "memprof_cuda_device_info") == [
        ({"device": "cuda:0", "gpu": "", "gpu_uuid": f"GPU-{HEX_A}", "UUID": f"GPU-{HEX_A}",
          "mig_uuid": "", "GPU_I_ID": ""}, 1.0)]
    assert rows(s, "memprof_gpu_process_torch_reserved_bytes") == []
