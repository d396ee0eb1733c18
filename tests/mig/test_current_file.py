"""Current-layout files (``gpufleet mig plan --current``) checked by pydantic models: one error
naming the file, line and field, with a did-you-mean for a misspelt key or profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.mig.fleet import load_current
from tests.file_errors import assert_file_error


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a misspelt key
        (
            "nodes:\n  - name: n0\n    modl: h200\n    gpus: []\n",
            ":3: nodes[0].modl: unknown field 'modl' (did you mean 'model'?)",
        ),
        # a wrong type
        (
            "nodes:\n  - name: n0\n    model: h200\n    gpus: [{3g.71gb: two}]\n",
            ":4: nodes[0].gpus[0].3g.71gb: expected a whole number, got 'two'",
        ),
        (
            "nodes:\n  - name: n0\n    model: h200\n    gpus: 3\n",
            ":4: nodes[0].gpus: expected a list",
        ),
        # a missing required field
        ("nodes:\n  - name: n0\n    gpus: []\n", ":2: nodes[0].model: missing required field"),
        # names checked against the catalog
        (
            "nodes:\n  - model: h200\n    gpus:\n      - {3g.71gb: 2}\n      - {3g.7gb: 1}\n",
            ":5: nodes[0].gpus[1]: unknown MIG profile for h200-sxm '3g.7gb' (did you mean",
        ),
        (
            "nodes:\n  - name: n0\n    model: h200\n    gpus: [{4g.71gb: 2}]\n",
            ":4: nodes[0].gpus[0]: 2x4g.71gb is not a valid MIG layout of h200-sxm",
        ),
    ],
)
def test_one_error_names_file_line_and_field(tmp_path: Path, body: str, expected: str) -> None:
    assert_file_error(tmp_path / "layout.yaml", body, load_current, expected)


def test_json_written_by_a_tool_reads_too(tmp_path: Path) -> None:
    f = tmp_path / "layout.json"
    f.write_text('{"nodes": [{"name": "a", "model": "h200", "gpus": [{"1g.18gb": 7}, {}, null]}]}')
    gpus = load_current(f)
    assert [(g.node, g.index) for g in gpus] == [("a", 0), ("a", 1), ("a", 2)]
    assert gpus[0].current is not None and gpus[0].current.counts == {"1g.18gb": 7}
    assert gpus[1].current is not None and gpus[1].current.counts == {}
