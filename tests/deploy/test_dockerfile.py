"""The Dockerfile (not built here: no registry is reachable): multi-stage, the final stage runs
as a non-root user with the package and nothing else, holds no secret, installs the package
the way CI does, and carries the image name and tag that the Kubernetes manifests run."""

from __future__ import annotations

import json
import re
import shlex

from typer.testing import CliRunner

from gpufleet import __version__
from gpufleet.cli.app import app
from gpufleet.schedulers.kubernetes.control_plane import RUN_AS
from tests.deploy.dockerfile import ROOT, arg_defaults, stages

WORKLOADS = ("DaemonSet", "Deployment")
TEXT = (ROOT / "Dockerfile").read_text(encoding="utf-8")
SECRETISH = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|PRIVATE|API_KEY|gf_[A-Za-z0-9_-]{8,}", re.I)


def test_multi_stage_and_the_final_stage_takes_only_the_installed_package() -> None:
    _globals, st = stages(TEXT)
    assert len(st) >= 2 and st[0].name is not None
    final = st[-1]
    copies = final.all("COPY")
    assert copies == [f"--from={st[0].name} /opt/gpufleet /opt/gpufleet"]
    assert not final.all("ADD")
    # the build stage copies the package's sources and metadata, not the tests or the repo
    build_copies = [shlex.split(c)[:-1] for c in st[0].all("COPY")]
    assert sorted(p for c in build_copies for p in c) == ["README.md", "pyproject.toml", "src"]


def test_non_root_user() -> None:
    _globals, st = stages(TEXT)
    users = st[-1].all("USER")
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("0", "root")
    # the uid the manifests' securityContext runs as (runAsNonRoot needs a numeric USER)
    assert user == str(RUN_AS)
    assert f"--uid {RUN_AS}" in " ".join(st[-1].all("RUN"))


def test_no_secrets_in_the_image() -> None:
    for op, arg in ((o, a) for s in stages(TEXT)[1] for o, a in s.steps):
        if op in ("ENV", "ARG", "LABEL"):
            assert not SECRETISH.search(arg), (op, arg)
        if op in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|token|\.pem|\.key\b|id_rsa", arg), (op, arg)
    # the build context is the package only: a stray .env or token file never reaches it
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!src"]


def test_install_mirrors_ci() -> None:
    """CI installs the project with pip from pyproject.toml (Makefile ``install``); the image
    does the same without the dev extras, and not editable (no sources at run time)."""
    _globals, st = stages(TEXT)
    runs = " ".join(st[0].all("RUN"))
    installs = re.findall(r"pip install ([^&]+)", runs)
    assert [i.strip() for i in installs] == ["--upgrade pip", "."]
    assert "-e" not in runs.split()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "pip install -q -e '.[all]'" in makefile  # what "the same install" refers to


def test_image_name_and_tag_match_the_manifests() -> None:
    _globals, st = stages(TEXT)
    args = arg_defaults(st[-1])
    ref = f"{args['GPUFLEET_IMAGE']}:{args['GPUFLEET_VERSION']}"
    assert args["GPUFLEET_VERSION"] == __version__
    res = CliRunner().invoke(app, ["config", "kubernetes", "--json"])
    assert res.exit_code == 0, res.output
    workloads = [o for o in json.loads(res.stdout)["objects"] if o["kind"] in WORKLOADS]
    assert sorted(o["kind"] for o in workloads) == ["DaemonSet", "Deployment"]
    images = {c["image"] for o in workloads for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {ref}
    assert f"docker build -t {ref} ." in TEXT  # the documented build command tags it so
    labels = " ".join(st[-1].all("LABEL"))
    assert 'org.opencontainers.image.ref.name="${GPUFLEET_IMAGE}:${GPUFLEET_VERSION}"' in labels
