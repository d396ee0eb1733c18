"""A replica's cache load while another replica registers nodes (issue 29): the node and GPU
reads used to be two statements, so a node committed between them left its GPUs without a
node and the restarting replica died of ``KeyError``. On PostgreSQL the load reads one
REPEATABLE READ snapshot; everywhere, a GPU whose node was not read is skipped, and the next
load sees both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event

from gpufleet.control.service import ControlService
from tests.control.conftest import batch, push


def test_a_node_registered_between_the_node_and_gpu_reads_does_not_break_the_load(
    make_service: Callable[..., ControlService], db_config: dict[str, Any]
) -> None:
    writer = make_service(**db_config)
    push(writer, batch("na", 1))
    reader = make_service(**db_config)
    assert set(reader.store.nodes) == {"na"}
    fired: list[str] = []

    def register_between(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and "FROM gpus" in statement:
            fired.append(statement)
            push(writer, batch("nb", 1))

    event.listen(reader.engine, "before_cursor_execute", register_between)
    try:
        reader.store.load()
    finally:
        event.remove(reader.engine, "before_cursor_execute", register_between)
    assert fired, "the hook never ran between the node and GPU reads"
    # Whatever the load saw is whole: every node it has, with all its GPUs.
    assert set(reader.store.nodes) == {"na"}
    assert sorted(reader.store.nodes["na"].gpus) == [0, 1]
    reader.store.load()
    assert set(reader.store.nodes) == {"na", "nb"}
    assert sorted(reader.store.nodes["nb"].gpus) == [0, 1]
