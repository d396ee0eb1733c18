"""`gpufleet config kubernetes` also emits the control plane: every object loads into the
official client's typed models, the namespaces come first in apply order, and the pieces
refer to each other correctly (Secret, policy ConfigMap, Service, PodDisruptionBudget, the
agents' controller URL)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.state.remediation import load_policy
from gpufleet.errors import UsageError
from tests.kubernetes.test_manifests import KINDS, _round_trip

CP_KINDS = {**KINDS, "Secret": "V1Secret", "Deployment": "V1Deployment"}
CP_KINDS["PodDisruptionBudget"] = "V1PodDisruptionBudget"
runner = CliRunner()


def _generate(*args: str) -> list[dict[str, Any]]:
    res = runner.invoke(app, ["config", "kubernetes", "--json", *args])
    assert res.exit_code == 0, res.output
    objs: list[dict[str, Any]] = json.loads(res.stdout)["objects"]
    return objs


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def test_every_object_is_a_typed_model(mig_parted: Path) -> None:
    objs = _generate("--sharing", "mps", "--mig-config", str(mig_parted))
    seen = set()
    for obj in objs:
        if obj["kind"] != "ServiceMonitor":
            _round_trip(obj, CP_KINDS[obj["kind"]])
            seen.add(obj["kind"])
    assert seen == set(CP_KINDS)


def test_namespaces_are_created_before_anything_in_them(mig_parted: Path) -> None:
    objs = _generate("--namespace", "gf", "--mig-config", str(mig_parted))
    created: set[str] = set()
    for obj in objs:
        if obj["kind"] == "Namespace":
            created.add(obj["metadata"]["name"])
            continue
        ns = obj["metadata"].get("namespace")
        assert ns is None or ns in created, (obj["kind"], obj["metadata"]["name"], ns)
    # the MIG ConfigMap's namespace (the GPU Operator's) is one of them
    assert created == {"gf", "gpu-operator"}
    assert [o["kind"] for o in objs[:2]] == ["Namespace", "Namespace"]


def test_controller_deployment_service_pdb_secret_and_policy(tmp_path: Path) -> None:
    db_url = "postgresql://gpufleet:s3cret@db.example:5432/gpufleet"
    (tmp_path / "db-url").write_text(db_url + "\n", encoding="utf-8")
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_out_fraction: 0.05\n", encoding="utf-8")
    args = ["--db-url-file", str(tmp_path / "db-url"), "--policy", str(policy)]
    objs = _generate(*args, "--prometheus-url", "http://prometheus.monitoring:9090")
    dep = _one(objs, "Deployment")
    model = _round_trip(dep, "V1Deployment")
    assert model.spec.replicas == 2
    pod = model.spec.template.spec
    c = pod.containers[0]
    sc = c.security_context
    assert sc.run_as_non_root is True and sc.allow_privilege_escalation is False
    assert sc.read_only_root_filesystem is True and sc.capabilities.drop == ["ALL"]
    # the database URL: from the Secret into the environment, never in the arguments
    assert not any("postgresql" in a or "s3cret" in a for a in c.args)
    env = {e.name: e for e in c.env}
    ref = env["GPUFLEET_DB_URL"].value_from.secret_key_ref
    secret = _one(objs, "Secret", ref.name)
    assert secret["stringData"][ref.key] == db_url
    assert env["GPUFLEET_PROMETHEUS_URL"].value == "http://prometheus.monitoring:9090"
    assert "GPUFLEET_ADVERTISE_URL" not in env  # series from Prometheus: nothing to forward
    # the policy: the ConfigMap mounted where --policy points, holding the given policy
    policy_arg = c.args[c.args.index("--policy") + 1]
    mount = next(m for m in c.volume_mounts if policy_arg.startswith(m.mount_path + "/"))
    volume = next(v for v in pod.volumes if v.name == mount.name)
    cm = _one(objs, "ConfigMap", volume.config_map.name)
    key = policy_arg.rsplit("/", 1)[1]
    (tmp_path / "mounted.yaml").write_text(cm["data"][key], encoding="utf-8")
    assert load_policy(tmp_path / "mounted.yaml").max_out_fraction == 0.05
    # Service and PDB select the pods; one pod may go, one stays
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = next(
        o for o in objs if o["kind"] == "Service" and o["spec"].get("selector") == pod_labels
    )
    assert svc["spec"]["ports"][0]["targetPort"] == c.ports[0].name
    pdb = _round_trip(_one(objs, "PodDisruptionBudget"), "V1PodDisruptionBudget")
    assert pdb.spec.selector.match_labels == pod_labels
    assert pdb.spec.min_available == 1 < model.spec.replicas
    # the agents push to that Service
    ds = _one(objs, "DaemonSet")
    agent_args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    url = agent_args[agent_args.index("--controller") + 1]
    name, port = svc["metadata"]["name"], svc["spec"]["ports"][0]["port"]
    assert url == f"http://{name}.{svc['metadata']['namespace']}.svc:{port}"
    # the probe path answers without a token (the controller's /api/v1/health)
    assert c.readiness_probe.http_get.path == "/api/v1/health"


def test_manifest_file_with_the_database_password_is_private(tmp_path: Path) -> None:
    (tmp_path / "db-url").write_text("postgresql://u:pw@db/gf\n", encoding="utf-8")
    res = runner.invoke(
        app,
        [
            "config",
            "kubernetes",
            "--db-url-file",
            str(tmp_path / "db-url"),
            "--out",
            str(tmp_path / "k"),
        ],
    )
    assert res.exit_code == 0, res.output
    mode = stat.S_IMODE((tmp_path / "k" / "gpufleet.yaml").stat().st_mode)
    assert mode == 0o600
    bad = tmp_path / "bad-url"
    bad.write_text("mysql://x\n", encoding="utf-8")
    res = runner.invoke(app, ["config", "kubernetes", "--db-url-file", str(bad)])
    # a clear error naming the option and the file (the CLI's main prints it, no traceback)
    assert isinstance(res.exception, UsageError)
    assert str(res.exception).startswith(f"--db-url-file {bad}: expected")


def test_without_the_control_plane_and_one_replica() -> None:
    objs = _generate("--no-control-plane")
    assert not [o for o in objs if o["kind"] in ("Deployment", "Secret", "PodDisruptionBudget")]
    one = _generate("--controller-replicas", "1")
    pdb = _one(one, "PodDisruptionBudget")
    assert _one(one, "Deployment")["spec"]["replicas"] == 1
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}


def test_replicas_share_one_job_spec_key_kept_across_runs(tmp_path: Path) -> None:
    """Every replica (and every restart) must open the job specs the others sealed: the key
    comes from the Secret, mounted where the controller's data directory is, and a second run
    of the generator gives the same key (a new one would leave stored specs unreadable)."""
    from gpufleet.schedulers.embedded.sealing import SpecSealer

    out = tmp_path / "k8s"
    first = _generate("--out", str(out))
    key_file = out / "job-env.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    second = _generate("--out", str(out))
    keys = [_one(o, "Secret")["stringData"]["job-env-key"] for o in (first, second)]
    assert keys[0] == keys[1] == key_file.read_text().strip()
    pod = _one(first, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "job-key")
    assert env["GPUFLEET_DATA_DIR"] == mount["mountPath"] and mount["readOnly"] is True
    # no Prometheus: each pod advertises its own address for forwarded series reads
    assert env["GPUFLEET_ADVERTISE_URL"] == "http://$(POD_IP):8080"
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("GPUFLEET_ADVERTISE_URL")  # $(VAR): defined first
    volume = next(v for v in pod["volumes"] if v["name"] == "job-key")
    assert volume["secret"]["items"] == [{"key": "job-env-key", "path": "job-env.key"}]
    assert stat.S_IMODE((out / "gpufleet.yaml").stat().st_mode) == 0o600
    # what the pod sees: a read-only directory holding the key; the sealer reads it there
    data = tmp_path / "mounted"
    data.mkdir()
    (data / "job-env.key").write_text(keys[0] + "\n")
    data.chmod(0o500)
    try:
        sealed = SpecSealer.in_dir(data).seal('{"env": {"HF_TOKEN": "x"}}')
        assert SpecSealer(keys[0].encode()).open(sealed, "j1") == '{"env": {"HF_TOKEN": "x"}}'
    finally:
        data.chmod(0o700)
