"""What the real H200 captures (tests/fixtures/nvidia-h200/, read by hand from the files) say
about the device and its idle sample: every parser of them must give these values."""

from __future__ import annotations

from gpufleet.devices.types import DeviceInfo, Sample

MIB = 2**20


def assert_h200_info(info: DeviceInfo) -> None:
    """The captured H200's identity, memory, power limits, clocks, PCIe link and modes."""
    assert info.index == 0
    assert info.name == "NVIDIA H200"
    assert info.uuid == "GPU-a9be1d05-4c94-ff08-6f9e-9571d1d634c3"
    assert info.model == "h200-sxm"
    assert info.serial == "1653824018748"
    assert info.pci_bus_id == "00000000:00:06.0"
    assert info.pci_device_id == "0x233510DE"
    assert info.vbios_version == "96.00.A5.00.1A"
    assert info.inforom_version == "G520.0282.02.02"
    assert info.driver_version == "580.159.04"
    assert info.memory_total_bytes == 143771 * MIB
    assert info.power_limit_enforced_w == 700.0
    assert (info.power_limit_default_w, info.power_limit_min_w, info.power_limit_max_w) == (
        700.0,
        200.0,
        700.0,
    )
    assert (info.max_sm_clock_mhz, info.max_mem_clock_mhz) == (1980, 3201)
    assert (info.pcie_gen_current, info.pcie_gen_max) == (5, 5)
    assert (info.pcie_width_current, info.pcie_width_max) == (16, 16)
    assert info.persistence_mode is True
    assert (info.ecc_current, info.ecc_pending) == (True, True)
    assert (info.mig_current, info.mig_pending) == (False, False)
    assert info.compute_mode == "Default"


def assert_h200_idle_sample(s: Sample) -> None:
    """The captured H200 at idle: no load, memory use, temperatures, clocks, no ECC errors and
    no row remapping."""
    assert (s.gpu_util_pct, s.mem_util_pct) == (0.0, 0.0)
    assert s.mem_used_bytes == 0
    assert s.mem_free_bytes == 143156 * MIB
    assert s.mem_reserved_bytes == 616 * MIB
    assert (s.gpu_temp_c, s.mem_temp_c) == (35.0, 39.0)
    assert (s.sm_clock_mhz, s.mem_clock_mhz) == (345, 3201)
    assert (s.ecc_sbe_volatile, s.ecc_dbe_volatile) == (0, 0)
    assert (s.ecc_sbe_aggregate, s.ecc_dbe_aggregate) == (0, 0)
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable) == (0, 0)
    assert (s.remap_pending, s.remap_failure) == (False, False)
