"""nvidia-smi --query-gpu CSV parser: the real H200 capture, nounits/noheader, aliases, errors.

Expected values read by hand from tests/fixtures/nvidia-h200/nvidia-smi-query-gpu-all.csv.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.devices.smi import QUERY_FIELDS, canonical, parse_query_gpu_csv
from gpufleet.devices.types import Sample
from gpufleet.errors import ParseError
from tests.h200_capture import assert_h200_idle_sample, assert_h200_info

FIX = Path(__file__).parent / "fixtures" / "nvidia-h200"
MIB = 2**20


def test_real_capture_all_fields() -> None:
    rows = parse_query_gpu_csv((FIX / "nvidia-smi-query-gpu-all.csv").read_text(), "all.csv")
    assert len(rows) == 1
    info, s = rows[0]
    assert_h200_info(info)
    assert info.cuda_driver_version is None  # not a query-gpu field

    assert s.timestamp_s == pytest.approx(
        datetime(2026, 11, 30, 14, 56, 7, 28000, tzinfo=UTC).timestamp()
    )
    assert_h200_idle_sample(s)
    assert s.power_w == pytest.approx(79.46)
    assert s.clock_event_reasons == 0x1
    assert s.retired_pages_sbe is None  # "[N/A]"
    assert s.pcie_replay_count is None  # not a query-gpu field


def test_noheader_nounits_with_aliases() -> None:
    fields = [
        "index",
        "gpu_uuid",
        "gpu_name",
        "memory.total",
        "power.draw",
        "clocks.sm",
        "clocks_throttle_reasons.active",
        "pcie.link.width.current",
        "temperature.gpu",
    ]
    text = (
        "0, GPU-aaa, NVIDIA H200, 143771, 699.80, 1470, 0x0000000000000004, 16, 61\n"
        "1, GPU-bbb, NVIDIA H200, 143771, [N/A], 1980, 0x0000000000000000, 8, [Not Supported]\n"
    )
    rows = parse_query_gpu_csv(text, "q.csv", fields=fields)
    (a, sa), (b, sb) = rows
    assert (a.uuid, b.uuid) == ("GPU-aaa", "GPU-bbb")
    assert a.memory_total_bytes == 143771 * MIB
    assert sa.power_w == pytest.approx(699.80) and sb.power_w is None
    assert (sa.sm_clock_mhz, sb.sm_clock_mhz) == (1470, 1980)
    assert (sa.clock_event_reasons, sb.clock_event_reasons) == (0x4, 0)
    assert (a.pcie_width_current, b.pcie_width_current) == (16, 8)
    assert (sa.gpu_temp_c, sb.gpu_temp_c) == (61.0, None)
    assert b.index == 1


def test_fields_given_and_header_present_skips_header() -> None:
    text = "uuid, name, memory.used [MiB]\nGPU-a, NVIDIA H200, 1024 MiB\n"
    rows = parse_query_gpu_csv(text, "q.csv", fields=["gpu_uuid", "name", "memory.used"])
    assert len(rows) == 1
    assert rows[0][1].mem_used_bytes == 1024 * MIB
    assert rows[0][0].index == 0  # no index column: row order


def test_canonical_names() -> None:
    assert canonical(" memory.total [MiB]") == "memory.total"
    assert canonical("clocks.sm") == "clocks.current.sm"
    assert canonical("clocks_throttle_reasons.active") == "clocks_event_reasons.active"
    assert canonical("gpu.power.current_limit") == "enforced.power.limit"


def test_bad_numeric_cell_names_line_and_column() -> None:
    text = (
        "uuid, name, memory.total [MiB]\n"
        "GPU-a, NVIDIA H200, 143771 MiB\n"
        "GPU-b, NVIDIA H200, 12x MiB\n"
    )
    with pytest.raises(ParseError) as info:
        parse_query_gpu_csv(text, "node3.csv")
    err = info.value
    assert err.source == "node3.csv"
    assert err.where == "line 3, column 3 (memory.total)"
    assert err.problem == "'12x MiB' is not a number"


def test_wrong_column_count_and_missing_identity() -> None:
    with pytest.raises(ParseError, match=r"line 2: 2 columns, the header names 3"):
        parse_query_gpu_csv("uuid, name, memory.total [MiB]\nGPU-a, NVIDIA H200\n", "x.csv")
    with pytest.raises(ParseError, match="uuid"):
        parse_query_gpu_csv("name, memory.total [MiB]\nNVIDIA H200, 1 MiB\n", "x.csv")
    with pytest.raises(ParseError, match="empty"):
        parse_query_gpu_csv("\n", "x.csv")


def _documented_fields() -> set[str]:
    names: set[str] = set()
    for line in (FIX / "nvidia-smi-help-query-gpu.txt").read_text().splitlines():
        if line.startswith('"') and not line.startswith(('"0:', '"1:', '"2:', '"3:')):
            names.update(re.findall(r'"([^"]+)"', line))
    return names


def test_query_fields_are_real_nvidia_smi_fields() -> None:
    documented = _documented_fields()
    assert "memory.total" in documented  # the help file was read
    assert [f for f in QUERY_FIELDS if f not in documented] == []
    assert len(set(QUERY_FIELDS)) == len(QUERY_FIELDS)


def test_query_fields_fill_a_sample() -> None:
    # one row with a value for every field: each Sample field the CSV can carry must be set
    values = {
        "timestamp": "2026/11/30 14:56:07.028",
        "index": "0",
        "uuid": "GPU-a",
        "name": "NVIDIA H200",
        "clocks_event_reasons.active": "0x0000000000000004",
        "remapped_rows.pending": "No",
        "remapped_rows.failure": "No",
        "retired_pages.pending": "No",
    }
    row = ", ".join(values.get(f, "7") for f in QUERY_FIELDS)
    ((_, s),) = parse_query_gpu_csv(row + "\n", "q.csv", fields=list(QUERY_FIELDS))
    expected_set = {
        "gpu_util_pct",
        "mem_util_pct",
        "enc_util_pct",
        "dec_util_pct",
        "mem_used_bytes",
        "mem_free_bytes",
        "mem_reserved_bytes",
        "gpu_temp_c",
        "mem_temp_c",
        "power_w",
        "sm_clock_mhz",
        "mem_clock_mhz",
        "clock_event_reasons",
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remap_pending",
        "remap_failure",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "retired_pages_pending",
    }
    missing = [name for name in expected_set if getattr(s, name) is None]
    assert missing == []
    assert isinstance(s, Sample) and s.mem_used_bytes == 7 * MIB
