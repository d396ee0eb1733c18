"""The checklist as Markdown (for a ticket or a wiki) and as one self-contained HTML page (to
print and sign), both with the evidence beside each ticked item."""

from __future__ import annotations

import html

from gpufleet.checklist.model import Checklist

_MARK = {"done": "[x]", "warn": "[x] (warn)", "failed": "[ ] FAILED", "open": "[ ]"}


def to_markdown(c: Checklist) -> str:
    counts = c.counts()
    lines = [
        f"# Deployment checklist: {c.name}",
        "",
        f"{counts['done']} done, {counts['warn']} with warnings, {counts['failed']} failed, "
        f"{counts['open']} open. Evidence: {', '.join(c.sources)}.",
    ]
    for s in c.sections:
        lines += ["", f"## {s.title}", ""]
        for i in s.items:
            tail = f" — {i.evidence}" if i.evidence else ""
            lines.append(f"- {_MARK[i.state]} {i.text}{tail}")
    lines += [
        "",
        "## Sign-off",
        "",
        "| role | name | date | signature |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {role} |  |  |  |" for role in c.sign_off]
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;color:#222}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:1.6rem;border-bottom:1px solid #ccc}
ul{list-style:none;padding-left:0}li{margin:.35rem 0}
.ev{color:#555;font-size:.9em;display:block;margin-left:1.7rem}
.failed{color:#b00020}.warn{color:#a06000}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #999;padding:.6rem;text-align:left}
td{height:1.6rem}
"""


def to_html(c: Checklist) -> str:
    e = html.escape
    counts = c.counts()
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>Deployment checklist: {e(c.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Deployment checklist: {e(c.name)}</h1>",
        f"<p>{counts['done']} done, {counts['warn']} with warnings, {counts['failed']} failed, "
        f"{counts['open']} open. Evidence: {e(', '.join(c.sources))}.</p>",
    ]
    for s in c.sections:
        out.append(f"<h2>{e(s.title)}</h2><ul>")
        for i in s.items:
            checked = " checked" if i.state in ("done", "warn") else ""
            label = {"failed": " <b>FAILED</b>", "warn": " <b>warn</b>"}.get(i.state, "")
            ev = f"<span class=ev>{e(i.evidence)}</span>" if i.evidence else ""
            out.append(
                f"<li class={i.state}><input type=checkbox disabled{checked} "
                f"data-key='{e(i.key)}'>{label} {e(i.text)}{ev}</li>"
            )
        out.append("</ul>")
    out.append("<h2>Sign-off</h2><table><tr><th>role</th><th>name</th><th>date</th>")
    out.append("<th>signature</th></tr>")
    out += [f"<tr><td>{e(r)}</td><td></td><td></td><td></td></tr>" for r in c.sign_off]
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"
