"""What an in-process agent sees when it reopens after a simulated update: the simulator's
update command records the node's state (not in the fleet file), `SimFleet.reload_node` takes the
node's new versions and the faults the update left (a GPU off the bus), and a backend reopened
over the same simulated library reads them through NVML; other nodes are untouched."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.fleet import sim_reloader
from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.devices.sim.update import main as sim_update

OLD, NEW = "535.104.05", "550.90.07"
FLEET = f"""\
nodes:
  - {{name: a, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
  - {{name: b, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
faults:
  - {{node: a, gpu: 1, kind: update_gpu_lost}}
"""


def test_reload_takes_the_new_versions_and_the_lost_gpu(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(FLEET, encoding="utf-8")
    sim = SimFleet(parse_fleet_spec(str(f)))
    backends = {b.node_name: b for b in sim.backends()}
    assert backends["a"].device_info(0).driver_version == OLD
    assert "fallen_off_bus" not in [fa.kind.value for fa in sim.nodes["a"].gpus[1].faults]
    assert sim_update(["--fleet", str(f), "--node", "a", "--driver", NEW]) == 0
    backends["a"].close()  # the agent closed NVML for the update
    reload = sim_reloader(str(f), sim)
    assert reload is not None
    reload("a")
    fresh = backends["a"].reopened()
    assert [fresh.device_info(i).driver_version for i in (0,)] == [NEW]
    assert [fa.kind.value for fa in sim.nodes["a"].gpus[1].faults][-1] == "fallen_off_bus"
    assert backends["b"].device_info(0).driver_version == OLD  # not its update
    assert sim_reloader("4x8xh100-sxm", sim) is None  # a short spec has no file to re-read
