"""The job spec on the wire: one serialiser (`JOB_SPEC`) from the CLI's submission to the
scheduler's store to the agent's start command, with its limits checked on the way in."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from gpufleet.wire import JOB_SPEC, Ack, JobSpec, JobSubmit, WireCommand
from gpufleet.wire.problems import first_problem


def test_spec_round_trips_through_json() -> None:
    spec = JobSpec(
        "train",
        command=("python", "train.py"),
        gpus=2,
        nodes=3,
        env={"NCCL_DEBUG": "INFO"},
        duration_s=12.5,
        tenant="ml",
    )
    text = JOB_SPEC.dump_json(spec)
    assert json.loads(text)["command"] == ["python", "train.py"]  # a JSON list on the wire
    back = JOB_SPEC.validate_json(text)
    assert back == spec and back.command == ("python", "train.py")


def test_a_start_command_carries_the_spec_to_the_agent() -> None:
    spec = JobSpec("j", command=("sleep", "1"), gpus=1)
    cmd = WireCommand(op="start", job_id="j-1", generation=4, gpus=[0], spec=spec)
    raw = Ack(agent_id="a", seq=9, commands=[cmd]).model_dump_json()
    got = Ack.model_validate_json(raw).commands[0]
    assert got.spec == spec and got.generation == 4
    kill = WireCommand(op="kill", job_id="j-1", generation=4)
    assert Ack.model_validate_json(Ack(agent_id="a", seq=1, commands=[kill]).model_dump_json())


def test_submission_takes_the_tenant_it_is_given() -> None:
    sub = JobSubmit("j", command=("true",), gpus=4, priority=5)
    assert sub.tenant is None
    spec = sub.to_spec("team-a")
    assert (spec.tenant, spec.gpus, spec.priority, spec.command) == ("team-a", 4, 5, ("true",))


SUBMIT: TypeAdapter[JobSubmit] = TypeAdapter(JobSubmit)


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"gpus": 0}, "gpus"),
        ({"gpus": 1025}, "gpus"),
        ({"name": ""}, "name"),
        ({"duration_s": 0}, "duration_s"),
        ({"env": {"K": "v" * 8193}}, "env.K"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(bad: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as exc:
        SUBMIT.validate_python({"name": "j", **bad})
    assert first_problem(exc.value)[0] == where


def test_a_job_seen_in_a_scheduler_may_ask_for_no_gpu() -> None:
    # a CPU job listed by squeue is a JobSpec with gpus=0; a submission of one is refused above
    assert JOB_SPEC.validate_python({"name": "cpu-only", "gpus": 0}).gpus == 0


@pytest.mark.parametrize("job_id", ["../../tmp/x", "a/b", "", "x" * 65, "a b"])
def test_a_job_id_the_agent_would_turn_into_a_path_elsewhere_is_refused(job_id: str) -> None:
    # the agent's executor writes under <root>/job-<id>/: a lying controller cannot escape it
    with pytest.raises(ValidationError) as exc:
        WireCommand.model_validate({"op": "kill", "job_id": job_id, "generation": 1})
    assert first_problem(exc.value)[0] == "job_id"
