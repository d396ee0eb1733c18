"""`gpufleet config kubernetes`: agent DaemonSet, RBAC, Service, ServiceMonitor, ConfigMaps and
GPU Operator Helm values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import console, emit_json
from gpufleet.errors import ConfigError, ParseError, UsageError
from gpufleet.yamldoc import read_text_file, read_yaml


def _load_yaml(path: Path) -> dict[str, Any]:
    doc = read_yaml(read_text_file(path, "mig-parted config"), str(path)).data
    if not isinstance(doc, dict) or doc.get("version") != "v1" or "mig-configs" not in doc:
        raise ParseError(str(path), "version/mig-configs", "not a mig-parted config (version: v1)")
    return doc


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
    as_json: bool = JsonOption,
) -> None:
    """Kubernetes manifests and GPU Operator values for gpufleet."""
    from gpufleet.mig.sharing import mps_config, time_slicing_config
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
    objs = kubernetes_objects(
        namespace=namespace,
        controller_url=controller_url,
        nvml_access=nvml_access,
        mig_config=_load_yaml(mig_config) if mig_config else None,
        sharing=share_doc,
        sharing_name=sharing,
        **kwargs,
    )
    values = gpu_operator_values(
        mig_strategy=mig_strategy, sharing=sharing, agent_exports=not dcgm_exporter
    )
    manifests = yaml.safe_dump_all(objs, sort_keys=False)
    values_text = yaml.safe_dump(values, sort_keys=False)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpufleet.yaml").write_text(manifests, encoding="utf-8")
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
