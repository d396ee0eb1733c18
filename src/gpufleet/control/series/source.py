"""Where the series API (and so the dashboard's node and GPU charts) reads one GPU over time.

Two implementations behind one interface, chosen when the controller starts:

- `MemorySeries` (the default): raw samples from the in-memory rings
  (`gpufleet.control.state.rings`), minutes from the rollup table. A restarted controller
  starts with empty rings.
- `PrometheusSeries` (``gpufleet controller --prometheus-url URL``): PromQL over the agents'
  dcgm-exporter-compatible series (`gpufleet.telemetry.metrics`) in Prometheus or any store
  that answers Prometheus' HTTP API, so history outlives the controller and is kept as long as
  Prometheus keeps it. ``raw`` returns the samples Prometheus scraped (a range-vector selector,
  at most `MAX_RAW_WINDOW_S` back); ``minute`` returns ``avg/min/max_over_time`` per minute
  (``/api/v1/query_range`` with a 60 s step), the rollups' shape.

Prometheus HTTP API: https://prometheus.io/docs/prometheus/latest/querying/api/ (instant
queries return a ``matrix`` for a range-vector selector; range queries take POST forms).
Series are matched by the agent's ``Hostname`` label (the node's name) and ``gpu`` (its index).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from gpufleet.control.series import memory
from gpufleet.control.state.rings import FIELD_INDEX
from gpufleet.control.state.store import ControlStore, NodeView
from gpufleet.devices.types import CLOCK_REASON_WORDS
from gpufleet.errors import UsageError
from gpufleet.telemetry import metrics as M
from gpufleet.wire import views as sc

DEFAULT_RAW_WINDOW_S = 600.0  # raw samples without ``since_s``: the last 10 minutes
MAX_RAW_WINDOW_S = 3600.0  # raw samples are every scrape: older history is read by the minute
DEFAULT_MINUTE_WINDOW_S = 86400.0  # minutes without ``since_s``: the last day
MAX_MINUTES = 10_080  # a week of minutes, the rollups' cap (under Prometheus' 11,000 points)
_MIG_LABELS = frozenset(M.MIG_LABELS)
# The exposition's ``reason`` label of each clock-event bit (gpufleet.telemetry.exposition).
REASON_BITS = {word.lower().replace(" ", "_"): int(bit) for bit, word in CLOCK_REASON_WORDS.items()}
CLOCK_FIELD = "clock_event_reasons"


class SeriesUnavailable(Exception):
    """The series store did not answer (the API turns this into 503)."""


@dataclass(frozen=True)
class PromField:
    """How one kept field is read from Prometheus: the metric and its scale to our unit."""

    field: str
    metric: str
    scale: float  # the metric's value times this is the field's value
    summed: bool  # instance-scoped on MIG GPUs: one series per instance, summed


def _prom_fields() -> dict[str, PromField]:
    out: dict[str, PromField] = {}
    for m in M.DCGM_METRICS:
        if m.column in FIELD_INDEX and m.column not in out:
            out[m.column] = PromField(m.column, m.name, 1.0 / m.scale, m.mig)
    return out


# Kept fields with an agent metric; the agent exports no NVML PCIe throughput series
# (pcie_tx/rx_bytes_per_s), so those are absent (None) when read from Prometheus.
PROM_FIELDS = _prom_fields()


class SeriesSource(Protocol):
    """Reads one GPU's samples over time in the series API's shape."""

    kind: str

    def series(
        self,
        store: ControlStore,
        nc: NodeView,
        gpu: int,
        names: list[str],
        *,
        resolution: str,
        since_s: float | None,
    ) -> sc.Series: ...


class MemorySeries:
    """Raw samples from the controller's rings, minutes from its rollup table."""

    kind = "memory"

    def series(
        self,
        store: ControlStore,
        nc: NodeView,
        gpu: int,
        names: list[str],
        *,
        resolution: str,
        since_s: float | None,
    ) -> sc.Series:
        return memory.series(store, nc, gpu, names, resolution=resolution, since_s=since_s)


def check_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; a clear error otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--prometheus-url {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    return url.rstrip("/")


def shown_url(url: str) -> str:
    """``url`` without any user:password, for messages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    esc = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{esc}"'


def _num(text: Any) -> float | None:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class PrometheusSeries:
    """PromQL over the agents' series in Prometheus (see the module's docstring)."""

    kind = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = check_url(url)
        self.clock = clock
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, form: dict[str, str]) -> list[dict[str, Any]]:
        where = shown_url(self.url)
        try:
            r = self._client.post(f"{self.url}{path}", data=form)
        except httpx.HTTPError as exc:
            raise SeriesUnavailable(f"Prometheus at {where} did not answer: {exc}") from None
        try:
            doc = r.json()
        except ValueError:
            doc = {}
        if r.status_code != 200 or doc.get("status") != "success":
            why = doc.get("error") or r.text[:200]
            raise SeriesUnavailable(f"Prometheus at {where} answered {r.status_code}: {why}")
        result = doc.get("data", {}).get("result", [])
        return [x for x in result if isinstance(x, dict)]

    @staticmethod
    def _matchers(node: str, gpu: int) -> str:
        return f"{M.HOST_LABEL}={_quote(node)},gpu={_quote(str(gpu))}"

    def series(
        self,
        store: ControlStore,
        nc: NodeView,
        gpu: int,
        names: list[str],
        *,
        resolution: str,
        since_s: float | None,
    ) -> sc.Series:
        return memory.build_series(
            nc,
            gpu,
            resolution,
            lambda: self.raw(nc.name, gpu, names, since_s),
            lambda: self.minutes(nc.name, gpu, names, since_s),
        )

    # -- raw: the scraped samples ---------------------------------------------------------
    def raw(
        self, node: str, gpu: int, names: Sequence[str], since_s: float | None
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Every scraped sample of ``names`` since ``since_s``, on one time axis."""
        now = self.clock()
        window = DEFAULT_RAW_WINDOW_S if since_s is None else now - since_s
        window = min(max(window, 1.0), MAX_RAW_WINDOW_S)
        wanted = {PROM_FIELDS[n].metric: PROM_FIELDS[n] for n in names if n in PROM_FIELDS}
        metrics = sorted(wanted) + ([M.CLOCK_REASON] if CLOCK_FIELD in names else [])
        per_field: dict[str, dict[float, float]] = {}
        if metrics:
            sel = f'{{__name__=~"{"|".join(metrics)}",{self._matchers(node, gpu)}}}'
            result = self._get(
                "/api/v1/query", {"query": f"{sel}[{math.ceil(window)}s]", "time": f"{now:.3f}"}
            )
            per_field = _raw_fields(result, wanted)
        stamps = sorted({ts for col in per_field.values() for ts in col})
        if since_s is not None:
            stamps = [ts for ts in stamps if ts >= since_s]
        cols: dict[str, list[float | None]] = {}
        for name in names:
            col = per_field.get(name, {})
            cols[name] = [col.get(ts) for ts in stamps]
        return stamps, cols

    # -- minutes: avg/min/max over each minute ----------------------------------------------
    def minutes(
        self, node: str, gpu: int, names: Sequence[str], since_s: float | None
    ) -> tuple[
        list[float],
        dict[str, list[float | None]],
        dict[str, list[float | None]],
        dict[str, list[float | None]],
    ]:
        """Per-minute mean, min and max of ``names`` (``t`` is each minute's start)."""
        now = self.clock()
        # evaluation at T covers (T - 60, T]: T = a minute's end; the open minute included
        end = math.ceil(now / 60.0) * 60.0
        first = now - DEFAULT_MINUTE_WINDOW_S if since_s is None else since_s
        start = max(math.floor(first / 60.0) * 60.0 + 60.0, end - (MAX_MINUTES - 1) * 60.0)
        start = min(start, end)
        parts = []
        for name in names:
            pf = PROM_FIELDS.get(name)
            for agg in ("avg", "min", "max"):
                if pf is not None:
                    inner = f"{agg}_over_time({pf.metric}{{{self._matchers(node, gpu)}}}[1m])"
                    # MIG instances summed within one scrape job; jobs scraping the same
                    # agent agree, so the max over jobs
                    expr = (
                        f"max(sum by (job, instance) ({inner}))" if pf.summed else f"max({inner})"
                    )
                elif name == CLOCK_FIELD:
                    inner = f"{agg}_over_time({M.CLOCK_REASON}{{{self._matchers(node, gpu)}}}[1m])"
                    expr = f"max by (reason) ({inner})"
                else:
                    continue
                parts.append(
                    f'label_replace(label_replace({expr}, "f", {_quote(name)}, "", ""), '
                    f'"a", "{agg}", "", "")'
                )
        got: dict[tuple[str, str], dict[float, float]] = defaultdict(dict)
        if parts:
            result = self._get(
                "/api/v1/query_range",
                {"query": " or ".join(parts), "start": str(start), "end": str(end), "step": "60"},
            )
            got = _minute_fields(result)
        stamps = sorted({ts for col in got.values() for ts in col})
        t = [ts - 60.0 for ts in stamps]
        out: dict[str, dict[str, list[float | None]]] = {"avg": {}, "min": {}, "max": {}}
        for name in names:
            for agg, cols in out.items():
                col = got.get((name, agg), {})
                cols[name] = [col.get(ts) for ts in stamps]
        return t, out["avg"], out["min"], out["max"]


def _raw_fields(
    result: list[dict[str, Any]], wanted: dict[str, PromField]
) -> dict[str, dict[float, float]]:
    """The matrix of a raw query as ``{field: {t: value}}``. The GPU's series from one scrape
    target share a label set (apart from the metric name, MIG instance and clock reason):
    several such sets are the same agent scraped by several jobs, and the one with the most
    samples is used, so every field has the same scrape timestamps. Within it, MIG
    instances' series are summed per timestamp."""
    by_key: dict[tuple[tuple[str, str], ...], list[dict[str, Any]]] = defaultdict(list)
    for series in result:
        labels = series.get("metric", {})
        key = tuple(
            sorted(
                (k, v)
                for k, v in labels.items()
                if k not in _MIG_LABELS and k not in ("reason", "__name__")
            )
        )
        by_key[key].append(series)
    if not by_key:
        return {}
    _count, _key, best = max(
        (sum(len(s.get("values", [])) for s in ss), key, ss) for key, ss in by_key.items()
    )
    out: dict[str, dict[float, float]] = defaultdict(dict)
    for s in best:
        name = s.get("metric", {}).get("__name__", "")
        if name == M.CLOCK_REASON:
            col = out[CLOCK_FIELD]
            bit = REASON_BITS.get(s.get("metric", {}).get("reason", ""), 0)
            for ts, text in s.get("values", []):
                mask = int(col.get(float(ts), 0.0))
                col[float(ts)] = float(mask | bit if _num(text) else mask)
            continue
        pf = wanted.get(name)
        if pf is None:
            continue
        col = out[pf.field]
        for ts, text in s.get("values", []):
            v = _num(text)
            if v is not None:
                col[float(ts)] = col.get(float(ts), 0.0) + v * pf.scale
    return dict(out)


def _minute_fields(result: list[dict[str, Any]]) -> dict[tuple[str, str], dict[float, float]]:
    """The matrix of the minute query as ``{(field, agg): {t: value}}``. Clock reasons: a bit
    is set in ``max`` when the reason was active at any time in the minute, in ``min`` when
    all the minute, in the mean when at least half of it."""
    out: dict[tuple[str, str], dict[float, float]] = defaultdict(dict)
    for series in result:
        labels = series.get("metric", {})
        key = (labels.get("f", ""), labels.get("a", ""))
        col = out[key]
        if key[0] == CLOCK_FIELD:
            bit = REASON_BITS.get(labels.get("reason", ""), 0)
            for ts, text in series.get("values", []):
                v = _num(text)
                mask = int(col.get(float(ts), 0.0))
                col[float(ts)] = float(mask | bit if v is not None and v >= 0.5 else mask)
            continue
        pf = PROM_FIELDS.get(key[0])
        scale = pf.scale if pf else 1.0
        for ts, text in series.get("values", []):
            v = _num(text)
            if v is not None:
                col[float(ts)] = v * scale
    return out


def make_source(prometheus_url: str | None) -> SeriesSource:
    """The source a controller reads series from: Prometheus when a URL is given."""
    if prometheus_url:
        return PrometheusSeries(prometheus_url)
    return MemorySeries()
