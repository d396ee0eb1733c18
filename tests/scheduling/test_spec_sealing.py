"""Job specs at rest (issue 12, item 7): a copy of the controller's database does not reveal a
job's env, the key file is private, and a controller restarted on the same data directory reads
its jobs back."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.devices.sim import ManualClock
from gpufleet.errors import ConfigError
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.schedulers.embedded.sealing import KEY_FILE
from gpufleet.wire import Batch
from tests.control.conftest import T0, batch, push

SECRET = "hf_Zq8w3secretvalue-never-on-disk"


def _service(data: Path) -> ControlService:
    svc = ControlService(
        ServiceConfig(data_dir=data, tick_s=60.0),
        clock=ManualClock(T0),
        scheduler=EmbeddedBackend(tick_s=60.0),
    )
    svc.start()
    push(svc, batch("n1", 1))  # one node whose agent runs jobs
    jobs = {
        "lease_s": 30,
        "slots": [{"index": 0, "model": "h100-sxm", "memory_bytes": 80 << 30}],
        "copies": [],
    }
    report = {"node": "n1", "agent_id": "agent-n1", "seq": 1, "sent_at_s": T0, "jobs": jobs}
    svc.scheduler.exchange(Batch.model_validate(report), T0)
    return svc


def _database_bytes(data: Path, copy: Path) -> bytes:
    """What a copy of the database files (the database, its WAL) holds, as a backup takes it."""
    copy.mkdir()
    out = b""
    for f in sorted(data.glob("gpufleet.db*")):
        shutil.copy(f, copy / f.name)
        out += (copy / f.name).read_bytes()
    assert out, f"no database files in {data}"
    return out


def test_a_copy_of_the_database_does_not_reveal_a_jobs_env(tmp_path: Path) -> None:
    data = tmp_path / "data"
    svc = _service(data)
    try:
        backend = svc.scheduler
        assert isinstance(backend, EmbeddedBackend)
        spec = JobSpec(name="train", command=("python", "train.py"), env={"HF_TOKEN": SECRET})
        jid = backend.submit(spec)
        assert backend.job(jid).spec.env == {"HF_TOKEN": SECRET}  # what the agent is sent
        stored = _database_bytes(data, tmp_path / "copy")
    finally:
        svc.stop()
    assert SECRET.encode() not in stored
    assert b"HF_TOKEN" not in stored and b"train.py" not in stored  # the whole spec is sealed
    assert SECRET.encode() not in _database_bytes(data, tmp_path / "copy-after-stop")
    key = data / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    # a controller restarted on the same directory (same key) reads the job back
    again = _service(data)
    try:
        assert isinstance(again.scheduler, EmbeddedBackend)
        assert again.scheduler.job(jid).spec.env == {"HF_TOKEN": SECRET}
    finally:
        again.stop()


def test_another_key_file_stops_the_start_with_an_error_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    svc = _service(data)
    try:
        assert isinstance(svc.scheduler, EmbeddedBackend)
        jid = svc.scheduler.submit(JobSpec(name="j", command=("true",), env={"K": SECRET}))
    finally:
        svc.stop()
    (data / KEY_FILE).unlink()  # a database restored without its key: a new key is made
    # reading the job (at the start, for a job that was placed) is an error naming the key
    started: list[ControlService] = []
    with pytest.raises(ConfigError, match=f"job {jid}: .*{KEY_FILE}"):
        started.append(_service(data))
        started[0].scheduler.job(jid)
    for s in started:
        s.stop()


def test_stop_ends_the_scheduler_thread_though_its_tick_is_long(tmp_path: Path) -> None:
    """The scheduler's loop waits up to tick_s (60 s here) for an agent's report; a stop wakes
    it (it used to wait out the 10 s join and leave the thread running)."""
    svc = _service(tmp_path / "data")
    backend = svc.scheduler
    assert isinstance(backend, EmbeddedBackend) and backend._thread is not None
    svc.stop()
    assert not backend._thread.is_alive()
