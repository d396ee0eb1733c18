"""Generated slurm.conf / gres.conf / topology.conf, checked against hand-derived lines."""

from __future__ import annotations

import pytest

from gpufleet.errors import ConfigError
from gpufleet.hostlist import compress, expand
from gpufleet.schedulers.slurm import config_gen as cg


def test_hostlist_round_trip() -> None:
    assert expand("gpu[001-003,007],login") == ["gpu001", "gpu002", "gpu003", "gpu007", "login"]
    assert compress(["gpu1", "gpu2", "gpu3", "gpu5"]) == "gpu[1-3,5]"
    assert compress(["n01", "n02"]) == "n[01-02]"
    with pytest.raises(ConfigError):
        expand("gpu[1-x]")


def test_gres_type_from_catalog() -> None:
    assert cg.gres_type("h100-sxm") == "h100"
    assert cg.gres_type("a100-sxm4-40gb") == "a100_sxm4_40gb"  # no one-word alias
    assert cg.gres_type("l40s") == "l40s"


def _plan(servers: int, levels: int, radix: int = 64) -> dict[str, object]:
    return {
        "chosen": "h100-sxm",
        "candidates": [
            {
                "candidate": "h100-sxm",
                "servers": servers,
                "server": {"gpus": 8, "gpu_key": "h100-sxm"},
                "fabric": {"compute": {"levels": levels, "radix": radix}},
            }
        ],
    }


def test_from_plan_two_level_tree() -> None:
    # 64 nodes on radix-64: groups of 32 nodes share a leaf per rail -> 2 leaves, 1 spine.
    cl = cg.from_plan(_plan(64, 2))
    assert cg.node_lines(cl) == ["NodeName=gpu[001-064] Gres=gpu:h100:8 State=UNKNOWN"]
    assert cg.topology_conf(cl).splitlines()[1:] == [
        "SwitchName=leaf1 Nodes=gpu[001-032]",
        "SwitchName=leaf2 Nodes=gpu[033-064]",
        "SwitchName=spine1 Switches=leaf[1-2]",
    ]
    conf = cg.slurm_conf(cl)
    for line in (
        "SelectType=select/cons_tres",
        "GresTypes=gpu",
        "TopologyPlugin=topology/tree",
        "PartitionName=gpu Nodes=gpu[001-064] Default=YES MaxTime=INFINITE State=UP",
    ):
        assert line in conf.splitlines()
    gres = cg.gres_conf(cl).splitlines()
    assert gres[1] == "AutoDetect=off"
    # no catalog system in this plan: no affinity, said in a comment instead of Cores=
    assert gres[2].startswith("# gpu[001-064]: GPU-to-CPU affinity unknown: Cores= left out")
    assert gres[3:] == ["NodeName=gpu[001-064] Name=gpu Type=h100 Count=8 File=/dev/nvidia[0-7]"]


def test_from_plan_three_levels_and_single_switch() -> None:
    # radix 8: 4 nodes a group; 40 nodes -> 10 leaves; pods of 4 leaves -> 3 spines; 1 core.
    top = cg.topology_conf(cg.from_plan(_plan(40, 3, radix=8))).splitlines()[1:]
    assert top[9] == "SwitchName=leaf10 Nodes=gpu[037-040]"
    assert top[10:] == [
        "SwitchName=spine1 Switches=leaf[01-04]",
        "SwitchName=spine2 Switches=leaf[05-08]",
        "SwitchName=spine3 Switches=leaf[09-10]",
        "SwitchName=core1 Switches=spine[1-3]",
    ]
    one = cg.topology_conf(cg.from_plan(_plan(1, 1))).splitlines()[1:]
    assert one == ["SwitchName=leaf1 Nodes=gpu001"]


def test_from_inventory_types_and_errors() -> None:
    doc = {
        "nodes": [
            {"name": "a", "gpus": [{"model": "h100-sxm"}] * 2},
            {"name": "b", "gpus": [{"model": "h100-sxm"}, {"model": "l4"}]},
        ]
    }
    cl = cg.from_inventory(doc)
    assert cg.node_lines(cl) == [
        "NodeName=a Gres=gpu:h100:2 Features=h100 State=UNKNOWN",
        "NodeName=b Gres=gpu:h100:1,gpu:l4:1 Features=h100,l4 State=UNKNOWN",
    ]
    assert cg.gres_conf(cl).splitlines()[4:] == [  # header, AutoDetect, comment, a's line
        "NodeName=b Name=gpu Type=h100 Count=1 File=/dev/nvidia0",
        "NodeName=b Name=gpu Type=l4 Count=1 File=/dev/nvidia1",
    ]
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.name"):
        cg.from_inventory({"nodes": [{"gpus": []}]})
    with pytest.raises(ConfigError, match="candidates"):
        cg.from_plan({"nodes": []})


def test_health_check_wrapper_sets_slurm_conf() -> None:
    text = cg.health_check_wrapper(
        "/etc/slurm dir/slurm.conf", ["gpufleet", "health", "--exit-code"]
    )
    assert "export SLURM_CONF='/etc/slurm dir/slurm.conf'\n" in text
    assert text.rstrip().endswith("exec gpufleet health --exit-code")
    logged = cg.health_check_wrapper("/etc/slurm/slurm.conf", ["g"], "/var/log/g f/hc.log")
    assert "umask 077\n" in logged and "mkdir -p '/var/log/g f'\n" in logged
    assert logged.rstrip().endswith("exec g >/dev/null 2>>'/var/log/g f/hc.log'")
    assert cg.health_check_command(max_drained="2") == [
        "gpufleet", "health", "--exit-code", "--slurm-drain", "--duration", "1",
        "--max-drained", "2",
    ]  # fmt: skip
    assert cg.health_check_command(controller="https://c:8443", token_file="/etc/t")[-4:] == [
        "--controller", "https://c:8443", "--token-file", "/etc/t",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="token file"):
        cg.health_check_command(controller="https://c:8443")
    conf = cg.slurm_conf(cg.from_plan(_plan(1, 1)), health_check_program="/x/hc.sh")
    assert "HealthCheckProgram=/x/hc.sh" in conf.splitlines()
    assert "HealthCheckInterval=30" in conf.splitlines()


def _node(name: str, driver: str, memory_mb: int = 2_063_000) -> dict[str, object]:
    host = {
        "cpus": 224,
        "boards": 1,
        "sockets_per_board": 2,
        "cores_per_socket": 56,
        "threads_per_core": 2,
        "memory_mb": memory_mb,
    }
    gpu = {"model": "h200-sxm", "driver_version": driver}
    return {"name": name, "driver_version": driver, "host": host, "gpus": [gpu] * 8}


def test_inventory_topology_memory_and_driver_features() -> None:
    doc = {
        "nodes": [
            _node("n1", "550.54.15"),
            _node("n2", "550.54.15"),
            _node("n3", "570.86.10"),  # mixed drivers: a line of its own, told apart
            _node("n4", "550.54.15", memory_mb=1_031_000),
        ]
    }
    cl = cg.from_inventory(doc)
    topo = "CPUs=224 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 ThreadsPerCore=2"
    assert cg.node_lines(cl) == [
        f"NodeName=n[1-2] {topo} RealMemory=2063000 Gres=gpu:h200:8 "
        "Features=h200,driver_550.54.15 State=UNKNOWN",
        f"NodeName=n3 {topo} RealMemory=2063000 Gres=gpu:h200:8 "
        "Features=h200,driver_570.86.10 State=UNKNOWN",
        f"NodeName=n4 {topo} RealMemory=1031000 Gres=gpu:h200:8 "
        "Features=h200,driver_550.54.15 State=UNKNOWN",
    ]
    assert not any("CPU topology" in n for n in cl.notes)
    bare = cg.from_inventory({"nodes": [{"name": "s1", "gpus": [{"model": "h100-sxm"}]}]})
    assert any("no CPU topology or memory for s1" in n for n in bare.notes)


@pytest.mark.parametrize(
    ("host", "field"),
    [
        ({"cpus": 0}, "host.cpus"),
        ({"memory_mb": "lots"}, "host.memory_mb"),
        ({"threads_per_core": True}, "host.threads_per_core"),
        ([1, 2], "host must be a mapping"),
    ],
)
def test_inventory_bad_host_names_the_field(host: object, field: str) -> None:
    doc = {"nodes": [{"name": "a", "gpus": [], "host": host}]}
    with pytest.raises(ConfigError, match=rf"nodes\[0\]\.{field}"):
        cg.from_inventory(doc, source="inv.json")


def test_feature_names_are_constraint_safe() -> None:
    assert cg.driver_feature("550.54.15") == "driver_550.54.15"
    assert cg.feature_name("a&b|c[1]:d,e f") == "a_b_c_1__d_e_f"
