"""The agent's side of the gate into service: validation level 1, run by the agent itself.

With ``require_validation`` (the controller's default) a new node, a repaired node and a node
back from ``lost`` wait in ``validating`` until a validation result passes. The control plane
says so in each ``Ack`` (``validate_since_s``: the node waits since then); the agent then runs
level 1 once for that period and posts the result to ``POST /api/v1/validation-results`` with
its own token, so nodes go ``validating -> in_service`` on their own (a fail keeps the node out:
the controller sends it to ``repair`` with the failing checks as the reason).

What runs is `gpufleet.validate.runner.run_suite` at level 1 over the agent's own backend, with
two differences from ``gpufleet validate --level 1`` on the node, both so that the agent's
sampler is never disturbed and a node's work does not send it to repair:

- the health rules are not re-run over a fresh 3-second window: the agent's current verdict
  (the same rules over its sampler's window, XID events included) is the ``health_rules``
  result, so the check costs no wall time and no event is taken from the sampler's stream;
- processes already on a GPU are a warning, not a fail (`_processes_warn`);
- the backend it reads is shared with the sampler: event polls answer nothing and the backend
  is never closed, and every call has the device layer's NVML deadline
  (`gpufleet.devices.deadline`), so a hung GPU fails its checks within seconds.

Levels 2 and 3 (a maintenance campaign's ``--validate-level``: the ``Ack`` carries
``validate_level``) need the GPUs to themselves and real kernels, so the agent does not run
them in its own process: it runs ``gpufleet validate --level N --out FILE`` on its node (the
``validate_argv`` its CLI built: the same simulated node, or this host's GPUs) as a child
process with a timeout, and posts that report with its level (a fail sends the node to repair
with the failing checks; the controller does not let a lower level pass a node that a
campaign asks more of).

The agent starts a run only after a slow sampling round (device info re-read) has been judged,
so a repaired GPU is not judged on identity read before the repair. Validation runs on an
executor thread (one per agent, or a small pool shared by the agents of
`gpufleet up`), never on the sampling or push thread; a post that fails is retried later.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import httpx

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample
from gpufleet.health.types import Finding, Severity

if TYPE_CHECKING:
    from gpufleet.validate.results import TestResult, ValidationReport

log = logging.getLogger("gpufleet.agent.gate")

VALIDATION_PATH = "/api/v1/validation-results"
RETRY_S = 5.0  # after a failed run or post, the next Ack that still asks tries again after this
POST_TIMEOUT_S = 5.0
LEVEL_TIMEOUT_S = {2: 1800.0, 3: 4 * 3600.0}  # a child validation run past this: a fail


P = ParamSpec("P")
T = TypeVar("T")


class DaemonExecutor(Executor):
    """A few daemon threads running submitted calls: a validation waiting out an NVML deadline
    never holds the process at exit (`ThreadPoolExecutor` joins its workers then)."""

    def __init__(self, threads: int = 1, name: str = "gpufleet-validate") -> None:
        self._q: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        if self._stopped:
            raise RuntimeError("the executor is shut down")
        fut: Future[T] = Future()
        self._q.put((fut, lambda: fn(*args, **kwargs)))
        return fut

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, call = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(call())
            except BaseException as exc:  # handed to the future, never raised on this thread
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stopped = True
        if cancel_futures:
            while True:
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._q.put(None)
        if wait:
            for t in self._threads:
                t.join()


class SharedBackend:
    """The agent's backend as validation sees it: reads pass through, event polls answer
    nothing (the sampler owns the event stream) and closing does nothing (the sampler still
    uses the library)."""

    def __init__(self, inner: GpuBackend) -> None:
        self.inner = inner
        self.node_name = inner.node_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def device_count(self) -> int:
        return self.inner.device_count()

    def device_info(self, index: int) -> DeviceInfo:
        return self.inner.device_info(index)

    def sample_fast(self, index: int) -> Sample:
        return self.inner.sample_fast(index)

    def sample_slow(self, index: int) -> Sample:
        return self.inner.sample_slow(index)

    def sample(self, index: int) -> Sample:
        return self.inner.sample(index)

    def poll_events(self, timeout_ms: int = 0) -> list[GpuEvent]:
        return []

    def lost_gpus(self) -> frozenset[int]:
        return self.inner.lost_gpus()

    def problems(self) -> list[str]:
        return self.inner.problems()

    def close(self) -> None:
        return None

    def release(self) -> None:
        return None


class AgentEngine:
    """What `run_suite` needs for level 1 on one node (level 2 and 3 tests are not run here:
    they need the GPUs to themselves, which is `gpufleet validate` on the node)."""

    name = "agent"

    def __init__(self, backend: GpuBackend, clock: Callable[[], float]) -> None:
        self._backends: dict[str, GpuBackend] = {backend.node_name: SharedBackend(backend)}
        self._inner = backend
        self.now = clock

    def backends(self) -> dict[str, GpuBackend]:
        return self._backends

    def sleep(self, seconds: float) -> None:  # pragma: no cover - health_rules is not run here
        time.sleep(seconds)

    def cuda_usable(self, node: str, gpu: int) -> tuple[bool, str]:
        # The agent holds no CUDA context: a GPU NVML reports lost is unusable; running a
        # kernel is `gpufleet validate` on the node (the software check of its level 1).
        if gpu in self._inner.lost_gpus():
            return False, "GPU is lost"
        return True, "ok"

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the agent runs validation level 1 only ({name} is level 2/3)")


def health_results(
    node: str, gpus: Sequence[int], verdict: Severity, findings: Sequence[Finding]
) -> list[TestResult]:
    """The agent's current health judgement as ``health_rules`` results: one per GPU (its warn
    and fail findings), one for the node-wide ones, and a fail when the agent has no verdict
    yet (nothing sampled: it cannot vouch for the node)."""
    from gpufleet.validate.results import Status, TestResult

    def status(fs: Sequence[Finding]) -> Status:
        worst = max((f.severity for f in fs), default=Severity.OK)
        return (
            Status.FAIL
            if worst >= Severity.FAIL
            else Status.WARN
            if worst >= Severity.WARN
            else Status.PASS
        )

    def result(gpu: int | None, fs: Sequence[Finding]) -> TestResult:
        return TestResult(
            "health_rules",
            node,
            status(fs),
            "; ".join(f"{f.code}: {f.message}" for f in fs) or "no findings",
            gpu=gpu,
            details={"codes": [f.code for f in fs], "source": "agent"},
        )

    if verdict == Severity.UNKNOWN:
        return [
            TestResult("health_rules", node, Status.FAIL, "the agent has no health verdict yet")
        ]
    relevant = [f for f in findings if f.severity in (Severity.WARN, Severity.FAIL)]
    out = [result(g, [f for f in relevant if f.gpu_index == g]) for g in gpus]
    node_wide = [f for f in relevant if f.gpu_index is None]
    if node_wide:
        out.append(result(None, node_wide))
    return out


def run_level1(
    backend: GpuBackend,
    clock: Callable[[], float],
    verdict: Severity,
    findings: Sequence[Finding],
) -> ValidationReport:
    """Validation level 1 of the agent's node (see the module docstring)."""
    from gpufleet.validate.runner import RunOptions, run_suite
    from gpufleet.validate.suite import select_tests

    engine = AgentEngine(backend, clock)
    # health_rules: the agent's own verdict below; readiness: the agent checked its host at
    # start and sends what it found with every batch (a simulated node is not this host)
    tests = select_tests(1, skip=["health_rules", "readiness"])
    t0 = time.monotonic()
    report = run_suite(engine, RunOptions(tests=[*tests], level=1))
    report.tests.append("health_rules")
    report.results[:] = [_processes_warn(r) for r in report.results]
    gpus = sorted({r.gpu for r in report.results if r.gpu is not None})
    report.results.extend(health_results(backend.node_name, gpus, verdict, findings))
    report.wall_s = time.monotonic() - t0
    return report


def _processes_warn(r: TestResult) -> TestResult:
    """Processes already on a GPU are a warning at the gate, not a fail: they say nothing
    about the hardware (repair is for hardware), and a node back from ``lost`` re-validates
    with its own jobs still running. `gpufleet validate` on the node still fails them (its
    level 2 and 3 tests need the GPUs to themselves)."""
    from dataclasses import replace

    from gpufleet.validate.results import Status

    if r.test != "processes" or r.status is not Status.FAIL:
        return r
    return replace(r, status=Status.WARN, message=f"{r.message} (a warning at the gate)")


def post_body(report: ValidationReport, node: str) -> dict[str, Any]:
    """What the agent posts: verdict, a one-line summary naming what failed, the report."""
    bad = [r for r in report.results if r.status.value in ("fail", "warn")]
    worst = [r for r in bad if r.status.value == report.status.value] or bad
    summary = "; ".join(
        f"{r.test}{'' if r.gpu is None else f' GPU {r.gpu}'}: {r.message}" for r in worst[:5]
    )
    return {
        "node": node,
        "verdict": report.status.value,
        "summary": f"level 1 by the agent: {summary or 'all checks pass'}"[:2000],
        "level": 1,
        "source": "agent",
        "report": report.to_dict(),
    }


def run_level(argv: Sequence[str], level: int, node: str) -> dict[str, Any]:
    """``gpufleet validate --level N`` as a child process (see the module docstring); the body
    to post. A run that cannot start, times out or writes no report is a fail, with why."""
    import json
    import subprocess
    import tempfile
    from pathlib import Path

    timeout_s = LEVEL_TIMEOUT_S.get(level, LEVEL_TIMEOUT_S[3])
    with tempfile.TemporaryDirectory(prefix="gpufleet-validate-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [*argv, "--level", str(level), "--out", str(out)]
        why = ""
        try:
            proc = subprocess.run(
                cmd, capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
            )
            if not out.exists():
                tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
                why = f"exit {proc.returncode}, no report" + (f": {tail[0][:200]}" if tail else "")
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"could not run: {exc}"[:300]
        if why:
            return {
                "node": node,
                "verdict": "fail",
                "summary": f"level {level} by the agent: gpufleet validate {why}",
                "level": level,
                "source": "agent",
            }
        doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    verdict = str(doc.get("status", "fail"))
    results = [r for r in doc.get("results", []) if isinstance(r, dict)]
    worst = [r for r in results if r.get("status") == verdict and verdict in ("fail", "warn")]
    parts = []
    for r in worst[:5]:
        gpu = r.get("gpu")
        where = "" if gpu is None else f" GPU {gpu}"
        parts.append(f"{r.get('test')}{where}: {r.get('message')}")
    summary = "; ".join(parts)
    return {
        "node": node,
        "verdict": verdict if verdict in ("pass", "warn", "fail") else "fail",
        "summary": f"level {level} by the agent: {summary or 'all checks pass'}"[:2000],
        "level": level,
        "source": "agent",
        "report": doc,
    }


class ValidationGate:
    """Runs level 1 when the control plane asks (`wanted`), at most once per ``validating``
    period, off the caller's thread, and posts the result."""

    def __init__(
        self,
        backend: GpuBackend,
        controller: str | Callable[[], str],
        token: str,
        *,
        health: Callable[[], tuple[Severity, Sequence[Finding]]],
        client: httpx.Client | None = None,
        executor: Executor | None = None,
        clock: Callable[[], float] = time.time,
        retry_s: float = RETRY_S,
        validate_argv: Sequence[str] = (),
    ) -> None:
        self.backend = backend
        self.validate_argv = tuple(validate_argv)
        # a callable: the replica the agent's pushes reach (``--controller URL1,URL2``)
        self._base = controller if callable(controller) else (lambda: controller)
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "gpufleet-agent"}
        self.health = health
        self.clock = clock
        self.retry_s = retry_s
        self._client = client
        self._own_client = client is None
        self._executor = executor
        self._own_executor = executor is None
        self._lock = threading.Lock()
        self._running = False
        self._closed = False
        self._done_for: float | None = None  # the validating period already answered
        self._retry_at = 0.0
        self.runs = 0
        self.posted = 0
        self.failures = 0
        self.last_verdict: str | None = None

    def due(self, since_s: float | None) -> bool:
        """Would `wanted` start a run for this ``validate_since_s`` now?"""
        if since_s is None:
            return False
        with self._lock:
            return not (
                self._running or since_s == self._done_for or time.monotonic() < self._retry_at
            )

    def wanted(self, since_s: float | None, level: int = 1) -> bool:
        """The control plane's ``validate_since_s``: start a run unless this period was
        answered, one runs, or a failed attempt waits; returns whether one started."""
        if since_s is None:
            return False
        with self._lock:
            if self._running or since_s == self._done_for:
                return False
            if time.monotonic() < self._retry_at:
                return False
            self._running = True
            if self._executor is None:
                self._executor = DaemonExecutor(1)
            executor = self._executor
        try:
            executor.submit(self._run, since_s, level)
        except RuntimeError:  # the executor shut down (the agent is stopping)
            with self._lock:
                self._running = False
            return False
        return True

    def _run(self, since_s: float, level: int = 1) -> None:
        ok = False
        retry_s = self.retry_s
        try:
            if level >= 2 and self.validate_argv:
                body = run_level(self.validate_argv, level, self.backend.node_name)
                self.runs += 1
                self.last_verdict = body["verdict"]
                log.info("validation level %d: %s (%s)", level, body["verdict"], body["summary"])
                ok = self._post(body)
                return
            verdict, findings = self.health()
            if verdict == Severity.UNKNOWN:  # nothing judged yet: ask again at the next Ack
                retry_s = 0.0
                return
            report = run_level1(self.backend, self.clock, verdict, findings)
            self.runs += 1
            body = post_body(report, self.backend.node_name)
            self.last_verdict = body["verdict"]
            log.info(
                "validation level 1: %s in %.2f s (%s)",
                body["verdict"],
                report.wall_s,
                body["summary"],
            )
            ok = self._post(body)
        except Exception as exc:
            if self._closed:  # the agent stopped (and released NVML) while it ran
                log.info("validation level 1 abandoned: the agent is stopping (%s)", exc)
            else:
                log.exception("validation level 1 failed to run")
        finally:
            with self._lock:
                self._running = False
                if ok:
                    self._done_for = since_s
                else:
                    self.failures += int(retry_s > 0)
                    self._retry_at = time.monotonic() + retry_s

    @property
    def url(self) -> str:
        """Where results go: the validation endpoint of the replica pushes reach."""
        return self._base().rstrip("/") + VALIDATION_PATH

    def _post(self, body: dict[str, Any]) -> bool:
        from gpufleet.jsonable import to_jsonable

        if self._client is None:
            self._client = httpx.Client(timeout=POST_TIMEOUT_S)
        try:
            resp = self._client.post(
                self.url, json=to_jsonable(body), headers=self._headers, timeout=POST_TIMEOUT_S
            )
        except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: client closed (stopping)
            log.warning("posting the validation result failed: %s", exc)
            return False
        if resp.status_code != 200:
            log.warning(
                "the control plane refused the validation result: HTTP %d %s",
                resp.status_code,
                resp.text[:200],
            )
            # 409: the node left validating meanwhile; nothing to retry for this period
            return resp.status_code == 409
        self.posted += 1
        return True

    def close(self) -> None:
        self._closed = True
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._own_client and self._client is not None:
            self._client.close()
