"""Maintenance campaigns' vocabulary (issue 15): campaign states (`CampaignState`), node steps
(`NodeStep`), the spec a campaign starts with (`CampaignSpec`), update-order keys, and how a
node's reported versions differ from the baseline. The engine is
`gpufleet.control.campaigns.engine`, its step handlers `gpufleet.control.campaigns.steps`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import func, select

from gpufleet.control.db.models import Gpu, Node
from gpufleet.maintenance.baseline import GPU_FIELDS, BaselineFile
from gpufleet.maintenance.windows import parse_schedule

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gpufleet.control.state.store import ControlStore, NodeCache


class CampaignState(StrEnum):
    """A campaign's state (stored as its value)."""

    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"  # stopped by too many failures; in-flight nodes go on, none start
    ABORTED = "aborted"  # stopped by an operator: nodes not yet updated are given back
    DONE = "done"
    PROPOSED = "proposed"  # by the recurring policy: waits for an operator to start it


class NodeStep(StrEnum):
    """Where a node is in its campaign (stored as its value); the engine's table of step
    handlers (`gpufleet.control.campaigns.steps.RULES`) says where each may lead."""

    SELECTED = "selected"
    CORDONED = "cordoned"
    DRAINING = "draining"
    EVACUATING = "evacuating"  # the drain deadline passed: jobs checkpoint-signalled, requeued
    UPDATING = "updating"
    REBOOTING = "rebooting"
    VERIFYING = "verifying"
    VALIDATING = "validating"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


RUNNING, PAUSED, HALTED = CampaignState.RUNNING, CampaignState.PAUSED, CampaignState.HALTED
ABORTED, DONE, PROPOSED = CampaignState.ABORTED, CampaignState.DONE, CampaignState.PROPOSED
LIVE_CAMPAIGN = (RUNNING, PAUSED, HALTED, ABORTED)  # the engine still has work in these
SELECTED, CORDONED, DRAINING = NodeStep.SELECTED, NodeStep.CORDONED, NodeStep.DRAINING
EVACUATING, UPDATING, REBOOTING = NodeStep.EVACUATING, NodeStep.UPDATING, NodeStep.REBOOTING
VERIFYING, VALIDATING = NodeStep.VERIFYING, NodeStep.VALIDATING
NODE_DONE, FAILED, SKIPPED = NodeStep.DONE, NodeStep.FAILED, NodeStep.SKIPPED
IN_FLIGHT = frozenset({CORDONED, DRAINING, EVACUATING, UPDATING, REBOOTING, VERIFYING, VALIDATING})
FINAL_STEPS = frozenset({NODE_DONE, FAILED, SKIPPED})
# findings that say a GPU is gone (its versions can no longer be read)
LOST_CODES = frozenset({"GPU_LOST", "XID_79"})
# may still be given back untouched
BEFORE_UPDATE = frozenset({SELECTED, CORDONED, DRAINING, EVACUATING})
# how long after its checkpoint grace an evacuated node may take to become idle before the
# campaign gives it back (the agent's kill, its report and the scheduler's tick)
EVACUATE_SLACK_S = 300.0


class CampaignSpec(BaseModel):
    """What ``gpufleet maintenance start`` asks for (``POST /api/v1/maintenance/campaigns``)."""

    model_config = ConfigDict(extra="forbid")

    baseline: BaselineFile
    select: list[tuple[str, str]] = Field(default_factory=list)  # (node|model|rack, glob)
    batch: int = Field(1, ge=1)
    floor: float = Field(0.9, ge=0.0, le=1.0)
    per_domain: int = Field(1, ge=1)
    windows: list[str] = Field(default_factory=list)  # empty: always
    max_failures: int = Field(2, ge=0)
    update_command: str = Field(min_length=1, max_length=4096)
    update_timeout_s: float = Field(3600.0, gt=0)
    drain_timeout_s: float = Field(3600.0, gt=0)
    # the drain's deadline: jobs still running then get the checkpoint signal, ``grace`` to
    # exit, and are requeued (None: wait for them until ``drain_timeout_s``, then give back)
    drain_deadline_s: float | None = Field(1800.0, gt=0)
    checkpoint_signal: str = Field("USR1", pattern=r"^(SIG)?[A-Z][A-Z0-9]{1,7}$")
    # Slurm's ``--signal=SIG@TIME`` defaults TIME to 60 s (sbatch(1))
    checkpoint_grace_s: float = Field(60.0, ge=0, le=86400)
    back_timeout_s: float = Field(1800.0, gt=0)
    verify_timeout_s: float = Field(300.0, gt=0)
    validate_timeout_s: float = Field(1800.0, gt=0)
    # 0: none; 1: the agent's gate; 2, 3: the agent runs `gpufleet validate --level N`
    validate_level: int = Field(1, ge=0, le=3)

    @field_validator("windows")
    @classmethod
    def _windows_parse(cls, value: list[str]) -> list[str]:
        from gpufleet.errors import UsageError

        try:
            parse_schedule(value or None)  # a bad window is refused when the campaign starts
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("checkpoint_signal")
    @classmethod
    def _signal_known(cls, value: str) -> str:
        import signal

        full = value if value.startswith("SIG") else f"SIG{value}"
        if full not in signal.Signals.__members__ or full in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"checkpoint_signal {value!r}: not a signal a job can trap")
        return value

    @model_validator(mode="after")
    def _deadline_before_timeout(self) -> CampaignSpec:
        late = self.drain_deadline_s is not None and self.drain_deadline_s >= self.drain_timeout_s
        if late and "drain_deadline_s" not in self.model_fields_set:
            self.drain_deadline_s = self.drain_timeout_s / 2  # the default, for a short timeout
        elif late:
            raise ValueError(
                f"drain_deadline_s ({self.drain_deadline_s:g}) must be shorter than "
                f"drain_timeout_s ({self.drain_timeout_s:g}): the timeout gives the node back"
            )
        return self

    @field_validator("select")
    @classmethod
    def _select_keys(cls, value: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for key, _glob in value:
            if key not in ("node", "model", "rack"):
                raise ValueError(f"select key {key!r}: one of node, model, rack")
        return value


@dataclass(frozen=True)
class StepChange:
    """One step taken (returned by `tick` for logging and tests)."""

    campaign: int
    node: str
    step: str
    reason: str


def update_key(campaign: int, node: str) -> str:
    """The key of a node's update order: the agent runs each key at most once."""
    return f"c{campaign}-{node}"[:128]


def deviations(store: ControlStore, nc: NodeCache, baseline: BaselineFile) -> list[str]:
    """How the node's GPUs (as last reported) differ from the baseline: ``gpu0 driver
    535.104.05 != 550.90.07``; a version not reported counts as a difference (unknown)."""
    target = baseline.models.get(nc.model or "")
    if target is None:
        return [f"no baseline for model {nc.model}"]
    wanted = target.model_dump(exclude_none=True)
    out: list[str] = []
    infos = gpu_infos(store, nc.name)
    for index in sorted(infos):
        info = infos[index]
        for key, attr in GPU_FIELDS.items():
            if key in wanted and str(info.get(attr)) != wanted[key]:
                out.append(f"gpu{index} {key} {info.get(attr) or 'unknown'} != {wanted[key]}")
    return out


def reported_since(s: Session, node_id: int, since_s: float) -> bool:
    """Whether the node's agent described any of its GPUs (changed or not) after
    ``since_s`` (the controller's clock: `Gpu.updated_s`)."""
    last = s.scalar(select(func.max(Gpu.updated_s)).where(Gpu.node_id == node_id))
    return last is not None and last > since_s


def gpu_infos(store: ControlStore, node: str) -> dict[int, dict[str, Any]]:
    """The device info of each of the node's GPUs as its agent last reported it."""
    with store.sessions() as s:
        q = select(Gpu.index, Gpu.info).join(Node, Node.id == Gpu.node_id).where(Node.name == node)
        return {i: dict(info or {}) for i, info in s.execute(q)}


def baseline_pair_errors(baseline: BaselineFile) -> list[dict[str, Any]]:
    """The models whose baseline names a driver with a CUDA release that driver cannot report
    (the catalog's table, `gpufleet.catalog.cuda.pair_problem`, as `load_baseline` checks a
    file), as FastAPI's 422 entries whose ``loc`` ends ``baseline.models.<model>.cuda``: such a
    baseline never verifies, so a campaign on it would fail every node it updated."""
    from gpufleet.catalog.cuda import pair_problem

    out: list[dict[str, Any]] = []
    for key, target in sorted(baseline.models.items()):
        problem = (
            pair_problem(target.driver, target.cuda) if target.driver and target.cuda else None
        )
        if problem:
            loc = ("body", "baseline", "models", key, "cuda")
            out.append({"type": "value_error", "loc": loc, "msg": problem, "input": target.cuda})
    return out
