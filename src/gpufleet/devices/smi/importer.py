"""``--import``: read nvidia-smi reports (``-q -x`` XML or ``-q`` text), one per node, and keep
whatever parses.

- Encoding: UTF-8, or UTF-16/UTF-32 with a byte-order mark (PowerShell's ``>`` writes UTF-16);
  UTF-16 without a mark is recognised by its NUL bytes and read too. Anything else that is not
  UTF-8 is refused naming the encoding problem, never as an XML "invalid token".
- ``Unable to determine the device handle for GPU <bus>: <reason>`` lines (nvidia-smi prints
  them for a GPU it cannot reach, ``GPU is lost`` after XID 79), a ``<gpu>`` whose values say
  ``GPU is lost`` or whose UUID is ``[Unknown Error]``, or a ``<gpu>`` with a malformed value:
  that GPU is left out and listed; the others are imported.
- A file that cannot be read or parsed at all is listed; the other files are imported.
- Warnings: ``attached_gpus`` differing from the GPUs in the document, the same GPU UUID in
  two files, a DTD newer than :data:`KNOWN_DTD_VERSION`.
- Node names are the file stems; files with the same stem (``a/node.xml``, ``b/node.xml``)
  get their parent directory prepended (``a/node``), then ``#2``, ``#3`` if still equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.devices.smi.text_report import looks_like_text_report, parse_smi_text
from gpufleet.devices.smi.xml_report import SmiReport, parse_smi_xml
from gpufleet.errors import ParseError

# Newest nvidia-smi XML DTD this parser was written against (driver 580: nvsmi_device_v13.dtd,
# tests/fixtures/nvidia-h200/nvidia-smi-q.xml).
KNOWN_DTD_VERSION = 13
_DTD_VERSION = re.compile(r"nvsmi_device_v(\d+)\.dtd")
_NO_HANDLE = re.compile(
    r"^\s*Unable to determine the device handle for (?:GPU|gpu)\s*([0-9A-Fa-f:.]+)\s*:\s*(.+?)\s*$"
)


@dataclass(frozen=True)
class ImportedNode:
    """One imported report and the node name it was given."""

    name: str
    report: SmiReport


@dataclass
class ImportResult:
    """Every report that parsed, what did not (``failed``: files and GPUs, one message each) and
    warnings. ``failed`` non-empty means the import was partial (commands exit 1)."""

    nodes: list[ImportedNode] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def decode_report(data: bytes, source: str) -> str:
    """The text of a report file: UTF-8 (BOM or not), or UTF-16/32 (with a BOM, or UTF-16
    recognised by its NUL bytes); ParseError naming the encoding otherwise."""
    boms = (
        (b"\xff\xfe\x00\x00", "utf-32"),
        (b"\x00\x00\xfe\xff", "utf-32"),
        (b"\xef\xbb\xbf", "utf-8-sig"),
        (b"\xff\xfe", "utf-16"),
        (b"\xfe\xff", "utf-16"),
    )
    encoding = next((enc for bom, enc in boms if data.startswith(bom)), None)
    if encoding is None and len(data) >= 2 and b"\x00" in data[:200]:
        # UTF-16 without a byte-order mark: ASCII text with every other byte NUL
        encoding = "utf-16-le" if data[1:2] == b"\x00" else "utf-16-be"
    try:
        return data.decode(encoding or "utf-8")
    except UnicodeDecodeError as exc:
        name = encoding or "UTF-8"
        raise ParseError(
            source,
            f"byte {exc.start}",
            f"not valid {name} text ({exc.reason}); save the report as UTF-8 "
            "(nvidia-smi -q -x > report.xml)",
        ) from None


def parse_report(text: str, source: str) -> SmiReport:
    """One report in either format, tolerant of unreadable GPUs (listed in ``unreadable``)."""
    lost: list[str] = []
    kept: list[str] = []
    for line in text.splitlines():
        m = _NO_HANDLE.match(line)
        if m is not None:
            lost.append(f"GPU {m[1]}: {m[2]}")
        else:
            kept.append(line)
    body = "\n".join(kept)
    if looks_like_text_report(body):
        report = parse_smi_text(body, source, tolerant=True)
    else:
        start = body.find("<")
        report = parse_smi_xml(body[start:] if start > 0 else body, source, tolerant=True)
    if lost:
        from dataclasses import replace

        report = replace(report, unreadable=(*report.unreadable, *lost))
    return report


def _warnings(report: SmiReport) -> list[str]:
    out: list[str] = []
    if report.dtd is not None:
        m = _DTD_VERSION.search(report.dtd)
        if m is not None and int(m[1]) > KNOWN_DTD_VERSION:
            out.append(
                f"{report.source}: DTD {report.dtd} is newer than the newest gpufleet knows "
                f"(nvsmi_device_v{KNOWN_DTD_VERSION}.dtd): renamed elements may read as N/A"
            )
    listed = len(report.gpus) + len(report.unreadable)
    if report.attached_gpus is not None and report.attached_gpus != listed:
        out.append(
            f"{report.source}: attached_gpus says {report.attached_gpus} but the report lists "
            f"{listed} GPU(s): GPUs missing from the report, or a hand-edited file"
        )
    return out


def _names(paths: list[Path]) -> list[str]:
    """Distinct node names: the stem, else parent/stem, else stem#N."""
    stems = [p.stem for p in paths]
    names = [
        s if stems.count(s) == 1 else (f"{p.parent.name}/{s}" if p.parent.name else s)
        for p, s in zip(paths, stems, strict=True)
    ]
    out: list[str] = []
    for name in names:
        candidate, n = name, 1
        while candidate in out:
            n += 1
            candidate = f"{name}#{n}"
        out.append(candidate)
    return out


def import_reports(paths: list[Path]) -> ImportResult:
    """Read every report; see the module doc for what is kept, listed and warned about."""
    result = ImportResult()
    owners: dict[str, str] = {}
    for path, name in zip(paths, _names(paths), strict=True):
        try:
            if path.is_dir():
                raise ParseError(str(path), "file", "is a directory; expected an nvidia-smi report")
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ParseError(
                    str(path), "file", f"cannot be read ({exc.strerror or exc})"
                ) from None
            report = parse_report(decode_report(data, str(path)), str(path))
        except ParseError as exc:
            result.failed.append(str(exc))
            continue
        result.failed.extend(f"{path}: {u}" for u in report.unreadable)
        result.warnings.extend(_warnings(report))
        shared: dict[str, list[str]] = {}
        for gpu in report.gpus:
            other = owners.setdefault(gpu.info.uuid, str(path))
            if other != str(path):
                shared.setdefault(other, []).append(gpu.info.uuid)
        for other, uuids in shared.items():
            result.warnings.append(
                f"{path}: {len(uuids)} GPU UUID(s) also in {other} ({', '.join(uuids[:3])}"
                f"{', ...' if len(uuids) > 3 else ''}): the same node captured twice, "
                "or a copied file"
            )
        result.nodes.append(ImportedNode(name, report))
    return result
