"""The worker every rank of a multi-node validation runs: ``python -m gpufleet.validate.multinode``.

Rank and world come from the environment (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, else Slurm's
``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``); the node name from ``GPUFLEET_NODE_NAME``,
else ``SLURMD_NODENAME``, else the host name. With ``--nproc-per-node R --node-rank K`` (ssh and
local launchers) this process is the node's starter: it runs R ranks (itself when R is 1).

Each rank: ``init_process_group`` (``env://``; NCCL when CUDA is available, else gloo), the
collectives sweep (all_reduce, all_gather, reduce_scatter, alltoall, broadcast over the sizes),
then the pairwise rounds and a second look at the slow pairs (see
:mod:`gpufleet.validate.pairwise`), then everything is gathered to
rank 0, which prints one line ``RESULT_MARK {json}`` on stdout (and writes ``--out`` if given).
A collective's time is the slowest rank's: the operation is done when every rank is done.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from gpufleet.validate.launch import RENDEZVOUS_FILE_ENV
from gpufleet.validate.pairwise import (
    SLOW_SEND_ENV,
    PairSample,
    SlowSend,
    better_pass,
    links_to_recheck,
    parse_slow_send,
    round_robin,
)

RESULT_MARK = "@@gpufleet-multinode-result@@"
SCHEMA = "gpufleet.validate.multinode/v1"
# gloo on CPUs is a rehearsal path: its sweep and pair messages stop at 16 MiB so a run on a few
# cores ends in seconds (a choice, not a measurement).
GLOO_MAX_BYTES = 16 * 2**20
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def rank_env() -> tuple[int, int, int, str]:
    """(rank, world size, local rank, node name) from the launcher's environment."""
    rank = _env_int("RANK", "SLURM_PROCID")
    world = _env_int("WORLD_SIZE", "SLURM_NTASKS")
    if rank is None or world is None:
        raise SystemExit("gpufleet multinode worker: RANK/WORLD_SIZE (or SLURM_PROCID) unset")
    local = _env_int("LOCAL_RANK", "SLURM_LOCALID") or 0
    node = (
        os.environ.get("GPUFLEET_NODE_NAME")
        or os.environ.get("SLURMD_NODENAME")
        or socket.gethostname()
    )
    return rank, world, local, node


def _sizes(lo: int, hi: int) -> list[int]:
    from gpufleet.validate.collectives import message_sizes

    return message_sizes(lo, hi)


class Worker:
    """One rank: the collectives sweep and the pairwise rounds."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args = torch, dist, args
        self.rank, self.world, self.local, self.node = rank_env()
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.backend = backend
        if backend == "nccl":
            torch.cuda.set_device(self.local)
            self.dev = torch.device(f"cuda:{self.local}")
        else:
            self.dev = torch.device("cpu")
            args.max_bytes = min(args.max_bytes, GLOO_MAX_BYTES)
            args.pair_bytes = min(args.pair_bytes, GLOO_MAX_BYTES)
        rendezvous_file = os.environ.get(RENDEZVOUS_FILE_ENV)
        dist.init_process_group(
            backend,
            init_method=f"file://{rendezvous_file}" if rendezvous_file else "env://",
            rank=self.rank,
            world_size=self.world,
            timeout=timedelta(seconds=args.timeout_s),
        )
        self.slow: SlowSend | None = parse_slow_send(os.environ.get(SLOW_SEND_ENV))
        self._all_nodes: list[str] = []

    def sync(self) -> None:
        if self.backend == "nccl":
            self.torch.cuda.synchronize()

    # ----- collectives ---------------------------------------------------------------------
    def _once(self, op: str, buf: Any, shard: Any, out: Any) -> None:
        d = self.dist
        if op == "all_reduce":
            d.all_reduce(buf)
        elif op == "all_gather":
            d.all_gather_into_tensor(out, shard)
        elif op == "reduce_scatter":
            d.reduce_scatter_tensor(shard, buf)
        elif op == "alltoall":
            d.all_to_all_single(out, buf)
        else:
            d.broadcast(buf, src=0)

    def collectives(self, sizes: list[int], iters: int) -> list[tuple[str, int, float]]:
        """(op, bytes, this rank's seconds per call) over the sweep."""
        torch, w = self.torch, self.world
        out_rows = []
        for op in OPS:
            for size in sizes:
                n = max(w, size // 4 // w * w)  # float32 elements, divisible by the world
                buf = torch.ones(n, dtype=torch.float32, device=self.dev)
                shard = torch.ones(n // w, dtype=torch.float32, device=self.dev)
                out = torch.empty_like(buf)
                self._once(op, buf, shard, out)  # warm-up (and NCCL communicator set-up)
                self.sync()
                self.dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    self._once(op, buf, shard, out)
                self.sync()
                out_rows.append((op, n * 4, (time.perf_counter() - t0) / iters))
                del buf, shard, out
        return out_rows

    # ----- pairwise ------------------------------------------------------------------------
    def pairwise(
        self,
        nodes: list[str],
        nbytes: int,
        iters: int,
        only: list[tuple[str, str]] | None = None,
    ) -> list[dict[str, Any]]:
        """Every local rank i of a node exchanges with local rank i of each peer node (of the
        pairs in ``only``, when given: the second look)."""
        torch, dist = self.torch, self.dist
        rank_of: dict[tuple[str, int], int] = {}
        locals_: dict[int, int] = {}
        names = self._all_nodes
        for r, n in enumerate(names):
            locals_[r] = sum(1 for q in range(r) if names[q] == n)
            rank_of[(n, locals_[r])] = r
        me = locals_[self.rank]
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
        ack = torch.zeros(1, dtype=torch.float32, device=self.dev)
        samples: list[dict[str, Any]] = []
        rounds = round_robin(nodes)
        if only is not None:
            rounds = [kept for r in rounds if (kept := [p for p in r if p in only])]
        if self.args.pair_serial:  # one pair at a time: no contention between pairs
            rounds = [[p] for r in rounds for p in r]
        for pairs in rounds:
            for a, b in pairs:
                if self.node not in (a, b):
                    continue
                peer_node = b if self.node == a else a
                peer = rank_of.get((peer_node, me))
                if peer is None:
                    continue  # the peer node has fewer ranks
                for sender, receiver in ((a, b), (b, a)):
                    if self.node == sender:
                        secs = self._send(buf, ack, peer, iters, receiver)
                        samples.append(
                            {
                                "sender": sender,
                                "receiver": receiver,
                                "local_rank": me,
                                "nbytes": buf.numel() * 4 * iters,
                                "seconds": secs,
                            }
                        )
                    else:
                        self._recv(buf, ack, peer, iters)
            dist.barrier()
        return samples

    def _send(self, buf: Any, ack: Any, peer: int, iters: int, receiver: str) -> float:
        dist = self.dist
        dist.send(buf, peer)  # warm-up, and the handshake that both sides are here
        dist.recv(ack, peer)
        self.sync()
        delay = (
            self.slow.delay_s(buf.numel() * 4)
            if self.slow and self.slow.applies(self.node, receiver)
            else 0.0
        )
        times = []
        for _ in range(iters):  # each iteration acknowledged: the median resists jitter
            t0 = time.perf_counter()
            dist.send(buf, peer)
            if delay:
                time.sleep(delay)  # test hook only (GPUFLEET_TEST_SLOW_SEND)
            dist.recv(ack, peer)  # the receiver has it all
            self.sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * iters

    def _recv(self, buf: Any, ack: Any, peer: int, iters: int) -> None:
        dist = self.dist
        dist.recv(buf, peer)
        dist.send(ack, peer)
        for _ in range(iters):
            dist.recv(buf, peer)
            self.sync()
            dist.send(ack, peer)

    # ----- the whole run -------------------------------------------------------------------
    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def run(self) -> dict[str, Any] | None:
        a = self.args
        info = {"node": self.node, "local_rank": self.local, "device": self._device_name()}
        ranks = self._gather(info)
        self._all_nodes = [r["node"] for r in ranks]
        nodes = list(dict.fromkeys(self._all_nodes))  # in rank order
        tests = set(a.tests.split(","))
        coll = (
            self.collectives(_sizes(a.min_bytes, a.max_bytes), a.iters)
            if ("collectives" in tests)
            else []
        )
        all_coll = self._gather(coll)
        pairs, again = self._pairs_twice(nodes, a) if "pairwise" in tests else ([], [])
        if self.rank != 0:
            return None
        rows = []
        for k, (op, size, _s) in enumerate(coll):
            rows.append({"op": op, "size_bytes": size, "seconds": max(c[k][2] for c in all_coll)})
        import torch

        return {
            "schema": SCHEMA,
            "backend": self.backend,
            "world_size": self.world,
            "nodes": nodes,
            "ranks": ranks,
            "torch_version": str(torch.__version__),
            "collectives": rows,
            "pairs": pairs,
            "rechecked": [f"{x}<->{y}" for x, y in again],
            "slow_send_hook": os.environ.get(SLOW_SEND_ENV) or None,
        }

    def _pairs_twice(
        self, nodes: list[str], a: argparse.Namespace
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """Every pair, then the slow ones again (the second look of
        :mod:`gpufleet.validate.pairwise`): the samples that count, and the pairs re-measured.
        Every rank holds the gathered first pass, so all agree on what to measure again."""
        first = [
            PairSample(**s)
            for ps in self._gather(self.pairwise(nodes, a.pair_bytes, a.pair_iters))
            for s in ps
        ]
        again = links_to_recheck(nodes, first)
        kept = first
        if again:
            second = self.pairwise(nodes, a.pair_bytes, a.pair_iters, only=again)
            kept = better_pass(
                nodes, first, [PairSample(**s) for ps in self._gather(second) for s in ps]
            )
        return [dataclasses.asdict(s) for s in kept], again

    def _device_name(self) -> str:
        if self.backend == "nccl":
            return str(self.torch.cuda.get_device_name(self.local))
        return "cpu"

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.validate.multinode", description=__doc__)
    ap.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    ap.add_argument("--tests", default="collectives,pairwise")
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=8 * 2**30)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--pair-bytes", type=int, default=2**30)
    ap.add_argument("--pair-iters", type=int, default=10)
    ap.add_argument("--pair-serial", action="store_true", help="one pair at a time")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--out", default=None, help="rank 0 also writes the result here")
    ap.add_argument("--nnodes", type=int, default=None)
    ap.add_argument("--node-rank", type=int, default=None)
    ap.add_argument("--nproc-per-node", type=int, default=None)
    return ap.parse_args(argv)


def _start_node(args: argparse.Namespace, argv: list[str]) -> int:
    """This process starts its node's ranks (ssh and local launchers)."""
    r, k, n = args.nproc_per_node, args.node_rank, args.nnodes
    if k is None or n is None or not 0 <= k < n:
        raise SystemExit("--nproc-per-node needs --nnodes N and --node-rank K (0 <= K < N)")
    base = {"WORLD_SIZE": str(n * r), "LOCAL_WORLD_SIZE": str(r)}
    if r == 1:
        os.environ.update(base, RANK=str(k), LOCAL_RANK="0")
        return _run_rank(args)
    rest = _strip_node_args(argv)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpufleet.validate.multinode", *rest],
            env={**os.environ, **base, "RANK": str(k * r + i), "LOCAL_RANK": str(i)},
        )
        for i in range(r)
    ]
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


def _strip_node_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--nnodes", "--node-rank", "--nproc-per-node"):
            skip = True
            continue
        if a.split("=")[0] in ("--nnodes", "--node-rank", "--nproc-per-node"):
            continue
        out.append(a)
    return out


def _run_rank(args: argparse.Namespace) -> int:
    w = Worker(args)
    try:
        result = w.run()
    finally:
        w.close()
    if result is not None:
        text = json.dumps(result)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        sys.stdout.write(f"{RESULT_MARK} {text}\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.nproc_per_node is not None:
        return _start_node(args, argv)
    return _run_rank(args)


if __name__ == "__main__":
    raise SystemExit(main())
