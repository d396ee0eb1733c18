"""`gpufleet config kubernetes`: agent DaemonSet, RBAC, Service, ServiceMonitor, ConfigMaps, the
control plane (Deployment, Service, PodDisruptionBudget, database Secret, policy ConfigMap) and
GPU Operator Helm values. Every namespace an object lives in is created first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
import yaml

from gpufleet.cli.common import JsonOption, http_url
from gpufleet.cli.output import console, emit_json, err_console
from gpufleet.errors import ConfigError, ParseError, UsageError
from gpufleet.yamldoc import read_text_file, read_yaml


def _load_yaml(path: Path) -> dict[str, Any]:
    doc = read_yaml(read_text_file(path, "mig-parted config"), str(path)).data
    if not isinstance(doc, dict) or doc.get("version") != "v1" or "mig-configs" not in doc:
        raise ParseError(str(path), "version/mig-configs", "not a mig-parted config (version: v1)")
    return doc


def _db_url(path: Path) -> str:
    text = read_text_file(path, "--db-url-file").strip()
    url = text.splitlines()[0].strip() if text else ""
    if not url.startswith(("postgresql://", "postgresql+psycopg://")):
        raise UsageError(f"--db-url-file {path}: expected one line postgresql://USER:PASS@HOST/DB")
    return url


def _job_key(path: Path | None) -> str:
    """The Fernet key sealing job specs: read from ``path`` when it exists, else a new one,
    written there (0600) so the next run gives the Secret the same key; without a path, a new
    key and a warning (a rotated key leaves earlier job specs unreadable)."""
    from cryptography.fernet import Fernet

    from gpufleet.schedulers.embedded.sealing import SpecSealer

    if path is not None and path.exists():
        key = read_text_file(path, "--job-key-file").strip()
        SpecSealer(key.encode(), f"--job-key-file {path}")  # a clear error for a bad key
        return key
    key = Fernet.generate_key().decode("ascii")
    if path is None:
        err_console.print(
            "a new job-spec key is in the Secret: give --job-key-file (or --out) to keep it "
            "across runs; applying a different key leaves stored job specs unreadable"
        )
        return key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key + "\n")
    except OSError as exc:
        raise ConfigError(f"--job-key-file {path}: cannot write: {exc.strerror or exc}") from exc
    err_console.print(f"made the job-spec key {path} (0600): keep it with the manifests")
    return key


def _policy_yaml(path: Path | None) -> str:
    """The policy file's text once it validates (the controller would refuse it at start),
    else the defaults written out."""
    from gpufleet.control.state.remediation import RemediationPolicy, load_policy

    if path is None:
        return yaml.safe_dump(RemediationPolicy().model_dump(mode="json"), sort_keys=False)
    load_policy(path)
    return read_text_file(path, "--policy")


def _image_of(objs: list[dict[str, Any]]) -> str:
    """The agents' image: the controller runs the same one."""
    for o in objs:
        if o["kind"] == "DaemonSet":
            return str(o["spec"]["template"]["spec"]["containers"][0]["image"])
    raise ConfigError("no agent DaemonSet among the generated objects")


def namespaces_first(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``objs`` with a Namespace for every namespace an object lives in, all of them first
    (``kubectl apply -f`` creates in file order; an object whose namespace does not exist yet
    is refused)."""
    spaces = [o for o in objs if o["kind"] == "Namespace"]
    rest = [o for o in objs if o["kind"] != "Namespace"]
    have = {o["metadata"]["name"] for o in spaces}
    for o in rest:
        ns = o["metadata"].get("namespace")
        if ns and ns not in have:
            have.add(ns)
            labels = {"app.kubernetes.io/part-of": "gpufleet"}
            if ns == "gpu-operator":
                # GPU Operator install docs: its namespace runs privileged pods
                labels["pod-security.kubernetes.io/enforce"] = "privileged"
            spaces.append(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": labels},
                }
            )
    return spaces + rest


def kubernetes_cmd(
    out: Path | None = typer.Option(None, "--out", help="Write the files into DIR."),
    namespace: str = typer.Option("gpufleet", "--namespace", help="Namespace of the agent."),
    image: str | None = typer.Option(None, "--image", help="Agent image."),
    controller_url: str | None = typer.Option(None, "--controller-url", help="Control plane."),
    nvml_access: str = typer.Option(
        "runtime-class", "--nvml-access", help="runtime-class (unprivileged) or host-devices."
    ),
    mig_config: Path | None = typer.Option(
        None, "--mig-config", help="mig-parted config (gpufleet mig plan --out)."
    ),
    mig_strategy: str = typer.Option("mixed", "--mig-strategy", help="single or mixed."),
    sharing: str | None = typer.Option(None, "--sharing", help="time-slicing or mps."),
    replicas: int = typer.Option(4, "--replicas", help="Replicas per GPU when sharing."),
    dcgm_exporter: bool = typer.Option(
        False, "--dcgm-exporter/--no-dcgm-exporter", help="Keep the Operator's dcgm-exporter."
    ),
    control_plane: bool = typer.Option(
        True, "--control-plane/--no-control-plane", help="Also the controller's objects."
    ),
    controller_replicas: int = typer.Option(
        2, "--controller-replicas", help="Controller pods (on one PostgreSQL)."
    ),
    controller_scheduler: str = typer.Option(
        "kubernetes", "--controller-scheduler", help="The controller's --scheduler."
    ),
    db_url_file: Path | None = typer.Option(
        None,
        "--db-url-file",
        help="File holding the PostgreSQL URL for the Secret (else a placeholder to edit).",
        metavar="FILE",
    ),
    job_key_file: Path | None = typer.Option(
        None,
        "--job-key-file",
        help="The key sealing job specs at rest, for the Secret: read when the file exists, "
        "else made (0600) and kept there for the next run (default: OUT/job-env.key).",
        metavar="FILE",
    ),
    policy: Path | None = typer.Option(
        None, "--policy", help="Remediation policy YAML for the ConfigMap (else defaults)."
    ),
    prometheus_url: str | None = typer.Option(
        None, "--prometheus-url", help="The controller reads series from this Prometheus."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Kubernetes manifests and GPU Operator values for gpufleet."""
    from gpufleet.mig.sharing import mps_config, time_slicing_config
    from gpufleet.schedulers.kubernetes.control_plane import (
        API_PORT,
        CONTROLLER,
        SECRET,
        control_plane_objects,
    )
    from gpufleet.schedulers.kubernetes.manifests import gpu_operator_values, kubernetes_objects

    if mig_strategy not in ("single", "mixed"):
        raise UsageError(f"--mig-strategy {mig_strategy!r}: use single or mixed")
    share_doc = None
    if sharing == "time-slicing":
        share_doc = time_slicing_config(replicas)
    elif sharing == "mps":
        share_doc = mps_config(replicas)
    elif sharing is not None:
        raise UsageError(f"--sharing {sharing!r}: use time-slicing or mps")
    kwargs: dict[str, Any] = {}
    if image:
        kwargs["image"] = image
    if control_plane and controller_url is None:
        controller_url = f"http://{CONTROLLER}.{namespace}.svc:{API_PORT}"
    objs = kubernetes_objects(
        namespace=namespace,
        controller_url=controller_url,
        nvml_access=nvml_access,
        mig_config=_load_yaml(mig_config) if mig_config else None,
        sharing=share_doc,
        sharing_name=sharing,
        **kwargs,
    )
    secret = False
    if control_plane:
        if controller_replicas < 1:
            raise UsageError("--controller-replicas must be at least 1")
        db_url = _db_url(db_url_file) if db_url_file else None
        secret = True  # the job-spec key is in it: the file is private
        objs += control_plane_objects(
            namespace=namespace,
            image=_image_of(objs),
            replicas=controller_replicas,
            db_url=db_url,
            job_key=_job_key(job_key_file or (out / "job-env.key" if out else None)),
            policy_yaml=_policy_yaml(policy),
            scheduler=controller_scheduler,
            prometheus_url=http_url(prometheus_url, "--prometheus-url") if prometheus_url else None,
        )
        if db_url is None:
            err_console.print(
                f"the Secret {SECRET} holds a placeholder database URL: edit it, or give "
                "--db-url-file"
            )
    objs = namespaces_first(objs)
    values = gpu_operator_values(
        mig_strategy=mig_strategy, sharing=sharing, agent_exports=not dcgm_exporter
    )
    manifests = yaml.safe_dump_all(objs, sort_keys=False)
    values_text = yaml.safe_dump(values, sort_keys=False)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            path = out / "gpufleet.yaml"
            if secret:  # the database password is in it: private before anything is written
                path.touch(mode=0o600)
                path.chmod(0o600)
            path.write_text(manifests, encoding="utf-8")
            (out / "gpu-operator-values.yaml").write_text(values_text, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    if as_json:
        emit_json({"objects": objs, "gpu_operator_values": values})
    elif out is not None:
        console.print(f"wrote {out}/gpufleet.yaml ({len(objs)} objects), gpu-operator-values.yaml")
        console.print(
            "apply: kubectl apply -f gpufleet.yaml; helm upgrade --install gpu-operator "
            "nvidia/gpu-operator -n gpu-operator -f gpu-operator-values.yaml",
            highlight=False,
        )
    else:
        typer.echo(manifests + "---\n# GPU Operator Helm values\n" + values_text, nl=False)


def register_config(config_app: typer.Typer) -> None:
    """Attach `gpufleet config kubernetes`."""
    config_app.command("kubernetes")(kubernetes_cmd)
