"""The figures guard (`benchmarks/guard.py`): its pure parts (budgets file, verdicts, table and
JSON, usage errors, the planted sitecustomize's code from `benchmarks/guard_plants.py`) without a
process or a socket, and one `process` test that the guard fails on a planted CLI-start
regression and passes without it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from benchmarks import guard_plants, guard_speed

GUARD_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "guard.py"


def _load_guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_benchmarks_guard", GUARD_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


guard = _load_guard()


def _budgets(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        name: {"budget": 1.0, "unit": unit, "why": "test"} for name, unit in guard.UNITS.items()
    }
    doc.update(overrides)
    return doc


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "budgets.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


# -- budgets file --------------------------------------------------------------------------------


def test_budgets_load(tmp_path: Path) -> None:
    budgets = guard.load_budgets(_write(tmp_path, _budgets()))
    assert set(budgets) == set(guard.FIGURES)
    assert budgets["cli_version_cpu_s"].budget == 1.0
    assert budgets["agent_rss_mib"].unit == "MiB"


def test_repository_budgets_cover_every_figure() -> None:
    budgets = guard.load_budgets(guard.DEFAULT_BUDGETS)
    assert set(budgets) == set(guard.FIGURES)
    assert all(b.why for b in budgets.values())


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "must be an object"),
        (_budgets(cli_help_cpu_s=3), "cli_help_cpu_s: must be an object"),
        (_budgets(cli_help_cpu_s={"unit": "s"}), "cli_help_cpu_s.budget"),
        (_budgets(cli_help_cpu_s={"budget": "1", "unit": "s"}), "cli_help_cpu_s.budget"),
        (_budgets(cli_help_cpu_s={"budget": -1, "unit": "s"}), "cli_help_cpu_s.budget"),
        (_budgets(cli_help_cpu_s={"budget": True, "unit": "s"}), "cli_help_cpu_s.budget"),
        (_budgets(cli_help_cpu_s={"budget": 1, "unit": "ms"}), "cli_help_cpu_s.unit"),
        (_budgets(cli_help_cpu_s={"budget": 1, "unit": "s", "why": 2}), "cli_help_cpu_s.why"),
        (_budgets(cli_helpp_cpu_s={"budget": 1, "unit": "s"}), "unknown figure 'cli_helpp_cpu_s'"),
    ],
)
def test_budgets_errors_name_the_file_and_field(tmp_path: Path, doc: Any, needle: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(guard.GuardError) as err:
        guard.load_budgets(path)
    message = str(err.value)
    assert str(path) in message
    assert needle in message
    assert "\n" not in message


def test_missing_budgets_file(tmp_path: Path) -> None:
    with pytest.raises(guard.GuardError, match="not found"):
        guard.load_budgets(tmp_path / "nope.json")


# -- usage: one line on stderr, exit 2, nothing started --------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--budgets", "{tmp}/nope.json"], "nope.json: not found"),
        (["--budgets", "{tmp}/bad.json"], "bad.json: not JSON"),
        (["--budgets", "{tmp}/ok.json", "--only", "cli_version_cpu_s,nope"], "'nope'"),
        (["--budgets", "{tmp}/ok.json", "--only", ","], "--only"),
        (["--budgets", "{tmp}/partial.json", "--only", "cli_help_cpu_s"], "no entry"),
        (["--plant", "everything"], "--plant"),
        (["--frobnicate"], "--frobnicate"),
    ],
)
def test_bad_usage_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    (tmp_path / "ok.json").write_text(json.dumps(_budgets()), encoding="utf-8")
    partial = {"cli_version_cpu_s": {"budget": 1, "unit": "s"}}
    (tmp_path / "partial.json").write_text(json.dumps(partial), encoding="utf-8")
    rc = guard.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("guard: ")
    assert needle in err
    assert "Traceback" not in err


def test_choose_figures_keeps_table_order() -> None:
    budgets = {n: guard.Budget(1.0, u, "") for n, u in guard.UNITS.items()}
    picked = guard.choose_figures("plan_100k_cpu_s, cli_help_cpu_s", budgets, Path("b.json"))
    assert picked == ["cli_help_cpu_s", "plan_100k_cpu_s"]
    assert guard.choose_figures(None, budgets, Path("b.json")) == list(guard.FIGURES)


# -- verdicts and output -------------------------------------------------------------------------


def _results() -> list[Any]:
    b = guard.Budget(2.0, "s", "")
    return [
        guard.judge("cli_version_cpu_s", 1.0, b, [1.0, 1.1, 0.9]),
        guard.judge("cli_help_cpu_s", 2.0, b),
        guard.judge("plan_100k_cpu_s", 3.0, b),
        guard.judge("validate_l1_1024_cpu_s", None, b, error="gpufleet validate exited 3"),
    ]


def test_verdicts() -> None:
    under, equal, over, failed = _results()
    assert (under.ok, under.status, under.ratio) == (True, "ok", 0.5)
    assert (equal.ok, equal.status) == (True, "ok")
    assert (over.ok, over.status, over.ratio) == (False, "OVER", 1.5)
    assert (failed.ok, failed.status, failed.ratio) == (False, "ERROR", None)


META = {
    "load_average": {"start": [1.5, 1.25, 1.0], "end": [2.0, 1.5, 1.0]},
    "cpus": 2,
    "wall_s": 61.2,
    "plant": None,
}


def test_table() -> None:
    text = guard.format_table(_results(), META)
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")] == [
        "figure",
        "value",
        "budget",
        "speed",
        "ratio",
        "ok/OVER",
    ]
    rows = {line.split("|")[0].strip(): line for line in lines[2:6]}
    assert rows["cli_version_cpu_s"].endswith("| ok")
    assert "1.000 s" in rows["cli_version_cpu_s"] and "0.50" in rows["cli_version_cpu_s"]
    assert rows["plan_100k_cpu_s"].endswith("| OVER")
    assert rows["validate_l1_1024_cpu_s"].endswith("| ERROR")
    assert "validate_l1_1024_cpu_s: gpufleet validate exited 3" in text
    assert "1.50/1.25/1.00 at start" in text and "2 CPUs" in text
    assert lines[-1] == "OVER or not measured: plan_100k_cpu_s, validate_l1_1024_cpu_s"
    assert guard.format_table(_results()[:2], META).splitlines()[-1] == "all figures in budget"


def test_json() -> None:
    doc = json.loads(guard.format_json(_results(), {**META, "plant": "cli-start"}))
    assert doc["ok"] is False and doc["plant"] == "cli-start"
    assert doc["load_average"]["start"] == [1.5, 1.25, 1.0]
    first, *_, last = doc["results"]
    assert first == {
        "figure": "cli_version_cpu_s",
        "value": 1.0,
        "unit": "s",
        "budget": 2.0,
        "ratio": 0.5,
        "speed": None,
        "status": "ok",
        "raw": [1.0, 1.1, 0.9],
        "error": None,
    }
    assert last["value"] is None and last["status"] == "ERROR"
    assert json.loads(guard.format_json(_results()[:1], META))["ok"] is True


# -- the planted sitecustomize -------------------------------------------------------------------


def _plant_namespace(tmp_path: Path, kind: str) -> dict[str, Any]:
    """The planted module's code run here (this process is pytest, not the gpufleet CLI: it
    burns nothing and hooks nothing)."""
    path = guard_plants.write_plant(tmp_path / "plant", kind) / "sitecustomize.py"
    source = path.read_text(encoding="utf-8")
    assert f"KIND = {kind!r}" in source
    ns: dict[str, Any] = {"__file__": str(path), "__name__": "planted"}
    before = list(sys.meta_path)
    t0 = time.process_time()
    exec(compile(source, str(path), "exec"), ns)
    assert time.process_time() - t0 < 0.5
    assert sys.meta_path == before
    return ns


def test_plant_cli_start_is_inert_outside_the_cli(tmp_path: Path) -> None:
    ns = _plant_namespace(tmp_path, "cli-start")
    assert ns["_is_gpufleet_cli"]() is False


def test_plant_validate_wraps_run_suite(tmp_path: Path) -> None:
    ns = _plant_namespace(tmp_path, "validate")
    calls: list[tuple[Any, ...]] = []

    def run_suite(*args: Any) -> str:
        calls.append(args)
        return "report"

    module = ModuleType("fake_runner")
    module.run_suite = run_suite  # type: ignore[attr-defined]
    ns["_wrap_runner"](module)
    assert module.run_suite is not run_suite
    assert module.run_suite("engine", "opts") == "report"
    assert calls == [("engine", "opts")]


def test_unknown_plant(tmp_path: Path) -> None:
    with pytest.raises(guard.GuardError, match="unknown kind"):
        guard_plants.write_plant(tmp_path, "everything")


# -- the guard for real --------------------------------------------------------------------------


def _guard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GUARD_PATH), "--only", "cli_version_cpu_s", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _row(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("cli_version_cpu_s "))


@pytest.mark.process
def test_guard_fails_on_a_planted_regression_and_passes_without() -> None:
    planted = _guard("--plant", "cli-start")
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert _row(planted.stdout).endswith("| OVER")
    assert "OVER or not measured: cli_version_cpu_s" in planted.stdout
    clean = _guard()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _row(clean.stdout).endswith("| ok")
    # the speed sampler ran alongside: the row carries the factor measured during it
    speed = [c.strip() for c in _row(clean.stdout).split("|")][3]
    assert speed.startswith("x") and float(speed[1:]) > 0, clean.stdout


def test_a_slower_machine_raises_the_cpu_budgets_never_the_memory_ones() -> None:
    b = {n: guard.Budget(2.0, u, "") for n, u in guard.UNITS.items()}
    slow = {n: guard.judge(n, 5.0, b[n], speed=3.0) for n in guard.UNITS}
    assert slow["cli_version_cpu_s"].budget == pytest.approx(6.0)
    assert slow["cli_version_cpu_s"].ok  # 5 s at a third of the speed: 1.7 s at the reference
    assert slow["controller_cpu_ms_per_batch"].budget == pytest.approx(6.0)
    assert slow["agent_cpu_pct_8gpu_1hz"].budget == pytest.approx(6.0)
    assert slow["agent_rss_mib"].budget == 2.0 and not slow["agent_rss_mib"].ok
    assert slow["controller_rss_kib_per_node"].budget == 2.0
    # a faster moment keeps the budget as set: a factor below 1 is never applied
    fast = guard.judge("cli_version_cpu_s", 1.9, b["cli_version_cpu_s"], speed=0.5)
    assert fast.budget == 2.0 and fast.ok
    # no sample: the budget as set
    assert guard.judge("cli_version_cpu_s", 2.1, b["cli_version_cpu_s"]).status == "OVER"


def test_speed_factor_is_the_median_of_the_runs_in_the_span() -> None:
    ref = guard_speed.REFERENCE_S
    samples = [(10.0, ref), (11.0, 2 * ref), (12.0, 3 * ref), (13.0, 4 * ref), (20.0, 9 * ref)]
    # runs ending in [11, 12 + slack]: 2x, 3x, 4x -> 3x
    assert guard_speed.factor_of(samples, 10.5, 12.0) == pytest.approx(3.0)
    # a span no run ended in: the run just before it
    assert guard_speed.factor_of(samples, 15.0, 15.2) == pytest.approx(4.0)
    assert guard_speed.factor_of([], 0.0, 1.0) is None
    assert guard_speed.factor_of(samples, 1.0, 2.0) is None  # nothing before or in it


def test_the_table_shows_each_figures_speed() -> None:
    b = guard.Budget(1.0, "s", "")
    m = guard.Budget(100.0, "MiB", "")
    rows = [
        guard.judge("cli_version_cpu_s", 1.5, b, speed=2.0),
        guard.judge("agent_rss_mib", 90.0, m, speed=2.0),
    ]
    lines = guard.format_table(rows, META).splitlines()
    cli = [c.strip() for c in lines[2].split("|")]
    assert cli == ["cli_version_cpu_s", "1.500 s", "2.000 s", "x2.00", "0.75", "ok"]
    assert [c.strip() for c in lines[3].split("|")][3] == "-"  # memory is not scaled
    assert any(f"{guard_speed.REFERENCE_S:.3f} s" in line for line in lines)
