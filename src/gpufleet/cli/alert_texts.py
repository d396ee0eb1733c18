"""The words of the generated alert rules: Prometheus templates for summaries and descriptions
that name the node, the GPU, the health finding code and its evidence, and the XID catalog's
names and actions rendered into template lookups.

Templates use only the labels the agent's series carry (`gpufleet.telemetry.exposition`:
``Hostname``, ``gpu``, ``UUID``, ``xid``, ``reason`` plus the scrape's ``instance``) and
Prometheus's template functions (``query``, ``first``, ``value``, ``humanize``, ``match``;
https://prometheus.io/docs/prometheus/latest/configuration/template_reference/). The agent does
not export its finding codes as series, so the generic verdict alerts (GPU or node failed /
warns) name the codes the evidence series show and point to the agent's ``/health`` for the
rest.
"""

from __future__ import annotations

from gpufleet.catalog import XidAction, XidSeverity, load_catalog

NODE = "{{ $labels.Hostname }}"
GPU = "GPU {{ $labels.gpu }}"
# "GPU 3 (GPU-8c1f...) on node-a"; a GPU lost before it was identified has no UUID label
GPU_FULL = "GPU {{ $labels.gpu }}{{ with $labels.UUID }} ({{ . }}){{ end }} on " + NODE
HEALTH_URL = "http://{{ $labels.instance }}/health"

ACTION_WORDS: dict[XidAction, str] = {
    XidAction.NONE: "no action needed",
    XidAction.RESTART_APP: "restart the application",
    XidAction.RESET_GPU: "reset the GPU",
    XidAction.REBOOT_NODE: "reboot the node",
    XidAction.DRAIN_AND_INSPECT: "drain the node and inspect the GPU",
}


def _q(expr: str) -> str:
    """A template pipeline querying ``expr`` for this alert's GPU (``%s`` slots: instance,
    gpu)."""
    return f"printf `{expr}` $labels.instance $labels.gpu | query"


# What the evidence series of this GPU show, as finding codes in words (each part only when
# its series says so): the generic GpufleetGpuFailed / GpufleetGpuWarning name them.
GPU_EVIDENCE = (
    "{{ with " + _q("gpufleet_gpu_lost{instance=%q,gpu=%q} == 1") + " }}"
    " GPU_LOST: it fell off the bus.{{ end }}"
    "{{ with " + _q("DCGM_FI_DEV_ROW_REMAP_FAILURE{instance=%q,gpu=%q} == 1") + " }}"
    " ROW_REMAP_FAILURE: row remapping failed.{{ end }}"
    "{{ with "
    + _q('gpufleet_clock_event_reason_active{instance=%q,gpu=%q,reason="hw_thermal"} == 1')
    + " }} HW_THERMAL_SLOWDOWN: HW thermal slowdown active.{{ end }}"
    "{{ range " + _q("gpufleet_xid_errors_total{instance=%q,gpu=%q}") + " | sortByLabel `xid` }}"
    " XID_{{ .Labels.xid }}: {{ .Value | humanize }} XID {{ .Labels.xid }} event(s)"
    " counted by the agent.{{ end }}"
)


def fatal_xids() -> list[int]:
    """The XID codes the catalog rates fail (the agent's finding for them is a fail)."""
    return sorted(c for c, x in load_catalog().xids.items() if x.severity is XidSeverity.FAIL)


def xid_severity_label() -> str:
    """The ``severity`` label of GpufleetXidErrors: critical for a code the catalog rates
    fail, else warning (as the agent's XID finding: unknown codes warn)."""
    codes = "|".join(str(c) for c in fatal_xids())
    return f'{{{{ if match "^({codes})$" $labels.xid }}}}critical{{{{ else }}}}warning{{{{ end }}}}'


def _xid_chain(words: dict[int, str], unknown: str) -> str:
    """A template choosing ``words[code]`` by ``$labels.xid``."""
    parts = []
    for i, (code, text) in enumerate(sorted(words.items())):
        parts.append(f'{{{{ {"if" if i == 0 else "else if"} eq $labels.xid "{code}" }}}}{text}')
    return "".join(parts) + f"{{{{ else }}}}{unknown}{{{{ end }}}}"


def xid_name() -> str:
    """The catalog's name of the alert's XID code."""
    names = {c: x.name for c, x in load_catalog().xids.items()}
    return _xid_chain(names, "not in gpufleet's XID catalog")


def xid_meaning() -> str:
    """The catalog's name, severity and action of the alert's XID code, in words."""
    words = {
        c: f"{x.name} ({x.severity.value}; {ACTION_WORDS[x.action]})"
        for c, x in load_catalog().xids.items()
    }
    return _xid_chain(words, "a code not in gpufleet's XID catalog (warn)")


def xid_count() -> str:
    """ "; the agent counted N of them": the agent's count of the alert's XID on its GPU."""
    q = "printf `gpufleet_xid_errors_total{instance=%q,gpu=%q,xid=%q}` $labels.instance"
    return (
        "{{ with " + q + " $labels.gpu $labels.xid | query }}; the agent counted "
        "{{ . | first | value | humanize }} of them{{ end }}"
    )


def node_gpus(expr: str, none: str) -> str:
    """ " GPU 0 GPU 3": the GPUs of this alert's node for which ``expr`` (one ``%q``: the
    instance) answers, sorted by the label (a query's order is not defined: promtool once gave
    "GPU 3 GPU 0"); `` none`` when it answers nothing."""
    return (
        "{{ with printf `" + expr + "` $labels.instance | query | sortByLabel `gpu` }}"
        "{{ range . }} GPU {{ .Labels.gpu }}{{ end }}{{ else }} " + none + "{{ end }}"
    )
