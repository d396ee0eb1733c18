"""Parsers of nvidia-smi outputs into the device layer's records.

- ``nvidia-smi -q -x`` -> :func:`parse_smi_xml` (:class:`SmiReport`: per GPU a ``DeviceInfo``, a
  ``Sample`` and its MIG devices); :func:`parse_smi_xml_file` for ``inventory --import``.
- ``nvidia-smi --query-gpu=... --format=csv`` -> :func:`parse_query_gpu_csv`;
  :data:`QUERY_FIELDS` are the fields of one full ``Sample``.
- ``nvidia-smi mig -lgip`` / ``-lgipp`` -> :func:`parse_mig_lgip`, :func:`parse_mig_lgipp`,
  :func:`combine_mig_profiles` (catalog ``MigProfile`` records).

Bad input raises :class:`gpufleet.errors.ParseError` naming the file and the element or line.
"""

from gpufleet.devices.smi.mig_listing import (
    LgippPlacement,
    LgipProfile,
    combine_mig_profiles,
    parse_mig_lgip,
    parse_mig_lgipp,
)
from gpufleet.devices.smi.query_csv import QUERY_FIELDS, canonical, parse_query_gpu_csv
from gpufleet.devices.smi.values import NOT_AVAILABLE, clean
from gpufleet.devices.smi.xml_report import (
    MigDevice,
    SmiGpu,
    SmiReport,
    parse_smi_xml,
    parse_smi_xml_file,
)

__all__ = [
    "NOT_AVAILABLE",
    "QUERY_FIELDS",
    "LgipProfile",
    "LgippPlacement",
    "MigDevice",
    "SmiGpu",
    "SmiReport",
    "canonical",
    "clean",
    "combine_mig_profiles",
    "parse_mig_lgip",
    "parse_mig_lgipp",
    "parse_query_gpu_csv",
    "parse_smi_xml",
    "parse_smi_xml_file",
]
