"""One hostlist parser (gpufleet.hostlist) for validate and the Slurm backend, checked against
a hand-written table of Slurm's syntax and, where Slurm is installed, against Slurm's own
``scontrol show hostnames`` (it needs no running cluster, only a slurm.conf to read)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import ConfigError, UsageError
from gpufleet.hostlist import compress, expand
from tests.hypothesis_budget import examples

SCONTROL = shutil.which("scontrol")
NEEDS_SCONTROL = pytest.mark.skipif(
    SCONTROL is None, reason="needs Slurm's scontrol (apt-get install slurm-client)"
)

# expression -> names, written from slurm.conf(5) and scontrol(1): the leftmost bracket group
# varies slowest, a range keeps the zero padding of its low end.
TABLE = {
    "r[1-2]n[1-2]": ["r1n1", "r1n2", "r2n1", "r2n2"],
    "gpu[001-003]": ["gpu001", "gpu002", "gpu003"],
    "gpu[01-03,07],login1": ["gpu01", "gpu02", "gpu03", "gpu07", "login1"],
    "a[1-2],b": ["a1", "a2", "b"],
    "a[8-11]": ["a8", "a9", "a10", "a11"],
    "a[08-11]": ["a08", "a09", "a10", "a11"],
    "a[98-101]": ["a98", "a99", "a100", "a101"],
    "a,b[1-2]c[5,7]": ["a", "b1c5", "b1c7", "b2c5", "b2c7"],
    "a[2,1]": ["a2", "a1"],
    "a[1-2],a[1-2]": ["a1", "a2", "a1", "a2"],
    "[1-3]": ["1", "2", "3"],
    "a, b": ["a", "b"],
    "foo": ["foo"],
}
BAD = ["a[3-1]", "a[1-2]]", "a[[1]]", "a[]", "a[x]", "a[1,,3]"]
# Where gpufleet departs from Slurm 22.05, on purpose: an unclosed bracket is an error (Slurm
# answers "a]"), and text after the last group is kept (Slurm 22.05 rejects ``n[1-2]-ib``).
STRICTER = ["a[1-2", "gpu[1-2", "a[1-2],b["]
LENIENT = {"n[1,3-4]-ib": ["n1-ib", "n3-ib", "n4-ib"], "x[1-2]y": ["x1y", "x2y"]}


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\nNodeName=localhost\n")
    return conf


def scontrol_hostnames(expr: str, conf: Path) -> list[str] | None:
    """Slurm's expansion, or None when Slurm rejects the expression."""
    assert SCONTROL is not None
    done = subprocess.run(
        [SCONTROL, "show", "hostnames", expr],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "SLURM_CONF": str(conf)},
        check=False,
    )
    if "Invalid" in done.stdout + done.stderr:
        return None
    return done.stdout.split()


@pytest.mark.parametrize(("expr", "names"), TABLE.items())
def test_table(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("expr", [*BAD, *STRICTER])
def test_bad_expressions_name_the_problem(expr: str) -> None:
    with pytest.raises(ConfigError, match="hostlist"):
        expand(expr)


@pytest.mark.parametrize(("expr", "names"), LENIENT.items())
def test_text_after_the_last_group(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


def test_unique_rejects_a_repeated_host() -> None:
    with pytest.raises(UsageError, match="'a1' appears twice"):
        expand("a[1-2],a1", unique=True)


@NEEDS_SCONTROL
@pytest.mark.parametrize("expr", [*TABLE, *BAD])
@pytest.mark.process
def test_agrees_with_scontrol(expr: str, slurm_conf: Path) -> None:
    slurm = scontrol_hostnames(expr, slurm_conf)
    if slurm is None:
        assert expr in BAD
        with pytest.raises(ConfigError):
            expand(expr)
    else:
        assert expand(expr) == slurm


def test_compress_table() -> None:
    assert compress(["gpu1", "gpu2", "gpu3", "gpu5"]) == "gpu[1-3,5]"
    assert compress(["n01", "n02", "login", "n04"]) == "n[01-02,04],login"
    assert compress(["a9", "a10", "a9"]) == "a[9-10]"


_name = st.builds(
    lambda stem, num, pad: stem + (f"{num:0{pad}d}" if num is not None else ""),
    st.sampled_from(["gpu", "node-", "r1n", "login", "x"]),
    st.one_of(st.none(), st.integers(min_value=0, max_value=300)),
    st.integers(min_value=1, max_value=4),
)


@given(st.lists(_name, max_size=40))
def test_compress_round_trip(names: list[str]) -> None:
    expanded = expand(compress(names), unique=True)
    assert sorted(expanded) == sorted(set(names))


_group = st.lists(
    st.tuples(st.integers(0, 120), st.integers(0, 5), st.integers(1, 3)), min_size=1, max_size=3
).map(lambda rs: ",".join(f"{lo:0{w}d}" + (f"-{lo + n}" if n else "") for lo, n, w in rs))
_expr = st.lists(
    st.builds(
        lambda stem, groups: "".join(f"{s}[{g}]" for s, g in zip(stem, groups, strict=False)),
        st.lists(st.sampled_from(["r", "n", "gpu", "rack-"]), min_size=2, max_size=2),
        st.lists(_group, min_size=1, max_size=2),
    ),
    min_size=1,
    max_size=3,
).map(",".join)


@NEEDS_SCONTROL
@settings(max_examples=examples(60), deadline=None)
@given(_expr)
@pytest.mark.process
def test_differential_against_scontrol(slurm_conf: Path, expr: str) -> None:
    assert expand(expr) == scontrol_hostnames(expr, slurm_conf)
