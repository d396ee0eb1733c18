"""Argument lists and error translation, with a fake runner (no cluster needed)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from gpufleet.errors import UnknownNameError
from gpufleet.schedulers.base import Feature, JobSpec, JobState
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.commands import CommandResult, SlurmBinaries, SlurmCommands
from gpufleet.schedulers.slurm.errors import (
    SlurmError,
    SlurmUnavailableError,
    SlurmUnknownJobError,
    SlurmUnknownNodeError,
    translate,
)


class FakeRunner:
    """Records every call; answers from a list of (returncode, stdout, stderr)."""

    def __init__(self, answers: list[tuple[int, str, str]] | None = None) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.answers = list(answers or [])

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append((list(argv), dict(env)))
        rc, out, err = self.answers.pop(0) if self.answers else (0, "", "")
        return CommandResult(tuple(argv), rc, out, err)


def backend(runner: FakeRunner, **kw: object) -> SlurmBackend:
    bins = SlurmBinaries.in_dir("/opt/slurm/bin", "/opt/slurm/sbin")
    cmd = SlurmCommands(binaries=bins, runner=runner, slurm_conf="/etc/x/slurm.conf", base_env={})
    return SlurmBackend(commands=cmd, **kw)  # type: ignore[arg-type]


def test_capabilities_say_why_not() -> None:
    caps = backend(FakeRunner()).capabilities()
    assert caps.supports(Feature.DRAIN) and caps.supports(Feature.REQUEUE)
    assert not caps.supports(Feature.CONTAINER_IMAGES) and "plugin" in caps.why(
        Feature.CONTAINER_IMAGES
    )
    assert not caps.supports(Feature.JOB_LOGS)  # no output directory given
    assert backend(FakeRunner(), output_dir="/out").capabilities().supports(Feature.JOB_LOGS)


def test_submit_argument_list_and_env() -> None:
    r = FakeRunner([(0, "42\n", "")])
    spec = JobSpec(
        name="train",
        tenant="acme",
        command=("python", "t.py", "--lr", "1e-3 x"),
        gpus=2,
        checkpoint_dir="/ckpt",
        env={"A": "1,2"},
    )
    assert backend(r, partition="gpu").submit(spec) == "42"
    argv, env = r.calls[0]
    assert argv == [
        "/opt/slurm/bin/sbatch",
        "--parsable",
        "--job-name=train",
        "--partition=gpu",
        "--nodes=1",
        "--gres=gpu:2",
        "--requeue",
        "--chdir=/ckpt",
        "--comment=tenant=acme",
        "--export=ALL",
        "--wrap=exec python t.py --lr '1e-3 x'",
    ]
    assert env == {
        "SLURM_CONF": "/etc/x/slurm.conf",
        "A": "1,2",
        "GPUFLEET_CHECKPOINT_DIR": "/ckpt",
    }


def test_a_job_gets_its_own_env_and_none_of_the_controllers_secrets() -> None:
    # sbatch --export=ALL hands the job sbatch's environment: it was the controller's whole
    # environment (its token, database URL, cloud credentials)
    r = FakeRunner([(0, "7\n", "")])
    controller_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/var/lib/gpufleet",
        "LC_ALL": "C.UTF-8",
        "SLURM_CLUSTER_NAME": "c1",
        "GPUFLEET_TOKEN": "gf_secret",
        "GPUFLEET_DB_URL": "postgresql://u:pw@db/gpufleet",
        "AWS_SECRET_ACCESS_KEY": "k",
        "PGPASSWORD": "pw",
    }
    cmd = SlurmCommands(runner=r, slurm_conf="/etc/x/slurm.conf", base_env=controller_env)
    spec = JobSpec(name="j", command=("true",), gpus=1, env={"PATH": "/opt/job/bin", "B": "2"})
    assert SlurmBackend(commands=cmd).submit(spec) == "7"
    argv, env = r.calls[0]
    assert "--export=ALL" in argv
    assert env == {
        "PATH": "/opt/job/bin",  # the job's own value wins
        "HOME": "/var/lib/gpufleet",
        "LC_ALL": "C.UTF-8",
        "SLURM_CLUSTER_NAME": "c1",
        "SLURM_CONF": "/etc/x/slurm.conf",
        "B": "2",
    }
    cmd.run(cmd.cancel_args("7"))  # other commands keep the controller's environment
    assert r.calls[1][1]["GPUFLEET_DB_URL"] == "postgresql://u:pw@db/gpufleet"


def test_submit_typed_gpu_and_federated_id() -> None:
    r = FakeRunner([(0, "7;cluster2\n", "")])
    assert backend(r).submit(JobSpec(name="s", gpu_model="h100-sxm", gpus=8, duration_s=3)) == "7"
    argv = r.calls[0][0]
    assert "--gres=gpu:h100:8" in argv and argv[-1] == "--wrap=sleep 3"


def _sinfo(state: str) -> tuple[int, str, str]:
    doc = {"nodes": [{"name": "gpu2", "state": state}, {"name": "gpu3", "state": "idle"}]}
    return 0, json.dumps(doc), ""


def test_node_and_job_commands() -> None:
    r = FakeRunner([(0, "", ""), _sinfo("drained"), (0, "", "")])
    b = backend(r)
    b.drain("gpu2", "XID 79: GPU fell off the bus")
    b.resume("gpu2")
    b.cancel("9")
    assert [c[0] for c in r.calls] == [
        [
            "/opt/slurm/bin/scontrol",
            "update",
            "NodeName=gpu2",
            "State=DRAIN",
            "Reason=gpufleet: XID 79: GPU fell off the bus",
        ],
        ["/opt/slurm/bin/sinfo", "--json"],
        ["/opt/slurm/bin/scontrol", "update", "NodeName=gpu2", "State=RESUME"],
        ["/opt/slurm/bin/scancel", "9"],
    ]


def test_resume_leaves_a_node_slurm_never_drained() -> None:
    r = FakeRunner([_sinfo("idle")])
    backend(r).resume("gpu2")  # a node entering service for the first time
    assert [c[0][0] for c in r.calls] == ["/opt/slurm/bin/sinfo"]
    with pytest.raises(UnknownNameError):
        backend(FakeRunner([_sinfo("idle"), _sinfo("idle")])).resume("gpu9")


def test_fail_drain_and_lost_node_requeue_the_jobs_running_there() -> None:
    jobs = {
        "jobs": [
            {"job_id": 5, "job_state": "RUNNING", "nodes": "gpu2"},
            {"job_id": 6, "job_state": "RUNNING", "nodes": "gpu3"},
            {"job_id": 7, "job_state": "PENDING"},
        ]
    }
    pending = json.dumps({"jobs": [{"job_id": 5, "job_state": "PENDING"}]})
    answers = [(0, "", ""), (0, json.dumps(jobs), ""), (0, "", ""), (0, pending, ""), (0, "", "")]
    r = FakeRunner(list(answers))
    backend(r).node_lost("gpu2")
    argvs = [c[0][1:] for c in r.calls]
    assert argvs[0][:3] == ["update", "NodeName=gpu2", "State=DRAIN"]
    assert argvs[0][3] == "Reason=gpufleet: node lost (no heartbeat)"
    assert ["requeue", "5"] in argvs and ["requeue", "6"] not in argvs
    assert argvs[-1] == ["update", "JobId=5", "StartTime=now"]
    plain = FakeRunner([(0, "", "")])
    backend(plain).drain("gpu2", "maintenance")  # not a failure: jobs finish where they run
    assert len(plain.calls) == 1


def test_is_idle_from_squeue() -> None:
    doc = json.dumps({"jobs": [{"job_id": 5, "job_state": "RUNNING", "nodes": "gpu[2-3]"}]})
    b = backend(FakeRunner([(0, doc, ""), (0, doc, "")]))
    assert not b.is_idle("gpu3") and b.is_idle("gpu1")


def test_requeue_waits_for_pending_then_starts_now() -> None:
    completing = json.dumps({"jobs": [{"job_id": 5, "job_state": "COMPLETING"}], "errors": []})
    pending = json.dumps({"jobs": [{"job_id": 5, "job_state": "PENDING"}], "errors": []})
    r = FakeRunner([(0, "", ""), (0, completing, ""), (0, pending, ""), (0, "", "")])
    backend(r, sleep=lambda s: None).requeue("5")
    assert [c[0][1:] for c in r.calls] == [
        ["requeue", "5"],
        ["--json", "--jobs=5"],
        ["--json", "--jobs=5"],
        ["update", "JobId=5", "StartTime=now"],
    ]


def test_requeue_gives_up_after_settle_time() -> None:
    completing = json.dumps({"jobs": [{"job_id": 5, "job_state": "COMPLETING"}]})
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += 1.0

    r = FakeRunner([(0, "", "")] + [(0, completing, "")] * 10)
    b = backend(r, requeue_settle_s=3, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(SlurmError, match="did not return to PENDING within 3 s"):
        b.requeue("5")


def test_squeue_and_sinfo_json_parsing() -> None:
    # Shapes as printed by Slurm 22.05.8 squeue/sinfo --json on the dev cluster.
    squeue = {
        "jobs": [
            {
                "job_id": 3,
                "name": "t",
                "job_state": "PENDING",
                "restart_cnt": 1,
                "nodes": "",
                "tres_per_node": "gres:gpu:1",
                "comment": "tenant=acme",
                "state_reason": "BeginTime",
                "gres_detail": [],
                "submit_time": 100,
                "start_time": 200,
                "node_count": 1,
            },
            {
                "job_id": 4,
                "name": "u",
                "job_state": "RUNNING",
                "restart_cnt": 0,
                "nodes": "gpu[1-2]",
                "tres_per_node": "gres:gpu:h100:2",
                "comment": "",
                "state_reason": "None",
                "gres_detail": ["gpu:h100:2(IDX:0-1)", "gpu:h100:2(IDX:0-1)"],
                "node_count": 2,
            },
        ],
        "errors": [],
    }
    sinfo = {
        "nodes": [
            {
                "name": "gpu1",
                "state": "mixed",
                "state_flags": ["DRAIN"],
                "reason": "xid79",
                "gres": "gpu:h100:2",
                "gres_used": "gpu:h100:1(IDX:0)",
            },
            {
                "name": "gpu2",
                "state": "idle",
                "state_flags": [],
                "reason": "",
                "gres": "gpu:h100:2",
                "gres_used": "gpu:h100:0(IDX:N/A)",
            },
        ],
        "errors": [],
    }
    r = FakeRunner([(0, json.dumps(squeue), ""), (0, json.dumps(sinfo), "")])
    b = backend(r)
    j3, j4 = b.list_jobs()
    assert (j3.state, j3.reason, j3.spec.tenant, j3.spec.gpus, j3.nodes) == (
        JobState.REQUEUED,
        "BeginTime",
        "acme",
        1,
        (),
    )
    assert (j4.state, j4.nodes, j4.spec.gpus, j4.gpus[:2]) == (
        JobState.RUNNING,
        ("gpu1", "gpu2"),
        2,
        (0, 1),
    )
    n1, n2 = b.node_states()
    assert (n1.state, n1.schedulable, n1.gpus_total, n1.gpus_allocated) == (
        "mixed+drain",
        False,
        2,
        1,
    )
    assert (n2.state, n2.schedulable, n2.gpus_allocated) == ("idle", True, 0)


def test_error_translation() -> None:
    bad_node = translate(
        ("scontrol", "update", "NodeName=gpu9", "State=DRAIN"),
        1,
        "slurm_update error: Invalid node name specified\n",
    )
    assert isinstance(bad_node, SlurmUnknownNodeError) and "gpu9" in str(bad_node)
    bad_job = translate(("scontrol", "requeue", "99"), 1, "Invalid job id specified for job 99\n")
    assert isinstance(bad_job, SlurmUnknownJobError) and "'99'" in str(bad_job)
    down = translate(
        ("sinfo", "--json"),
        1,
        "sinfo: error: Unable to contact slurm controller (connect failure)\n",
    )
    assert isinstance(down, SlurmUnavailableError)
    other = translate(("sbatch", "x"), 1, "sbatch: error: Batch job submission failed: Nope\n")
    assert str(other).startswith("sbatch failed: Batch job submission failed: Nope")


def test_unknown_node_names_known_nodes() -> None:
    sinfo = json.dumps({"nodes": [{"name": "gpu1"}, {"name": "gpu2"}]})
    r = FakeRunner([(1, "", "slurm_update error: Invalid node name specified\n"), (0, sinfo, "")])
    with pytest.raises(UnknownNameError) as ei:
        backend(r).drain("gpu3", "test")
    assert ei.value.name == "gpu3" and "gpu1" in str(ei.value)


def test_a_node_whose_job_is_still_configuring_is_not_idle() -> None:
    doc = json.dumps({"jobs": [{"job_id": 5, "job_state": "CONFIGURING", "nodes": "gpu2"}]})
    b = backend(FakeRunner([(0, doc, ""), (0, doc, "")]))
    assert not b.is_idle("gpu2") and b.is_idle("gpu1")
