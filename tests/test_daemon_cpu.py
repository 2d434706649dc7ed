"""Daemons and the host's CPUs: a daemon confined to one CPU says so, and
daemons sharing a host keep their threads to their own shares of its CPUs
(fanstore_daemon::cpu_share)."""
import os
import re
from pathlib import Path

import pytest

import fs_cluster
from fs_cluster import start_cluster
from fs_daemon import remote_pair, remote_reads_then_status
from fs_daemon import pack, source  # noqa: F401 (fixtures)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")
def test_a_daemon_confined_to_one_cpu_says_so(bins, pack, tmp_path):
    """A launcher that binds the daemon to one core confines every thread of
    it: the daemon says so at start and in STATUS, and names the launchers'
    options that unbind it (fanstore_daemon::wake_cost)."""
    ds = pack("none")
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})  # inherited by the singleton started now
    try:
        c = start_cluster(bins, ds, tmp_path, nranks=0)
    finally:
        os.sched_setaffinity(0, mine)
    try:
        with c.client(0) as cl:
            st = cl.status()
        assert (int(st["cpus_usable"]), int(st["cpus_online"])) == (1, os.cpu_count()), st
        assert st["wake_across_us"] == "-" and float(st["wake_same_us"]) > 0, st
        log = c.log()
        assert f"may run on 1 of the node's {os.cpu_count()} CPUs" in log and "--cpu-bind=none" in log, log[-3000:]
    finally:
        c.stop()
    # Unbound, nothing is said.
    c = start_cluster(bins, ds, tmp_path / "free", nranks=0)
    try:
        with c.client(0) as cl:
            assert int(cl.status()["cpus_usable"]) == len(mine)
        assert "may run on" not in c.log()
    finally:
        c.stop()


def _thread_cpus(pid):
    """{thread id: the CPUs it may run on} of every thread of process `pid`."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(t.name)] = frozenset(os.sched_getaffinity(int(t.name)))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def _cpu_list(text):
    """The CPUs of a list as `taskset -c` takes it ("0-2,5")."""
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def test_daemons_sharing_a_host_keep_to_their_own_shares_of_its_cpus(bins, pack, source, tmp_path):
    """Two daemons of one job on this host (as on one node): each keeps every
    thread, MPI's and those it starts later (a connection's, after reads),
    on its own share of the CPUs, the shares disjoint and together all of
    them, as two nodes would be (a launcher that binds ranks, OpenMPI with
    2 ranks, has made such shares already, and the daemons keep them), and
    STATUS `cpus` names that share (a node's programs can be started there).
    With --share-cpus off under a launcher that does not bind (MPICH), every
    thread may run on every CPU."""
    cpus = frozenset(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"this test needs 2 CPUs or more, it has {sorted(cpus)}"
    for extra in ((), ("--share-cpus", "off")):
        c, ds_id, remote = remote_pair(bins, pack, tmp_path / ("-".join(extra) or "auto"), *extra)
        try:
            statuses = remote_reads_then_status(c, remote, source, 20)
            shares = []
            for rank, pid in enumerate(c.pids()):
                per_thread = _thread_cpus(pid)
                assert len(per_thread) >= 3, f"rank {rank}: threads {per_thread}"
                kinds = set(per_thread.values())
                assert len(kinds) == 1, f"rank {rank}: its threads may run on different CPUs: {per_thread}"
                shares.append(kinds.pop())
                assert _cpu_list(statuses[rank]["cpus"]) == shares[-1], f"rank {rank}: STATUS {statuses[rank]['cpus']}, threads on {shares[-1]}"
            log = c.log()
        finally:
            c.stop()
        if extra:
            # --share-cpus off: the shares are what the launcher gave. MPICH's
            # hydra binds nothing; Open MPI 4 binds 2 ranks to their own cores;
            # Open MPI 5 (Debian 13) binds nothing when oversubscribed.
            assert "keeps its threads" not in log, log
            if fs_cluster.MPI == "mpich" or shares == [cpus, cpus]:
                assert shares == [cpus, cpus], f"--share-cpus off: {shares}, not every CPU {sorted(cpus)}\n{log}"
                continue
        assert not shares[0] & shares[1], f"the daemons' CPUs overlap: {shares}\n{log}"
        assert shares[0] | shares[1] == cpus, f"the shares {shares} are not all of {sorted(cpus)}\n{log}"
        if fs_cluster.MPI == "mpich":
            assert "keeps its threads" in log, log


def test_four_daemons_on_one_host_spread_over_its_cpus(bins, pack, tmp_path):
    """Four daemons of one job on this host: each keeps every thread on the
    share of the CPUs fanstore_daemon::cpu_share gives daemon i of 4 (with
    fewer CPUs than daemons, one CPU each, consecutive ranks together, as
    evenly as can be: 2 and 2 on 2 CPUs), unless the launcher bound the
    ranks itself, which the daemon then says and keeps."""
    cpus = sorted(os.sched_getaffinity(0))
    n, k = len(cpus), 4

    def expected(i):
        return frozenset(cpus[i * n // k:(i + 1) * n // k] if n >= k else [cpus[i * n // k]])

    c = start_cluster(bins, pack("none"), tmp_path, nranks=k)
    try:
        with c.client(0) as cl:
            cl.ping()
        log = c.log()
        for rank, pid in enumerate(c.pids()):
            kinds = set(_thread_cpus(pid).values())
            assert len(kinds) == 1, f"rank {rank}: its threads may run on different CPUs: {kinds}"
            if re.search(rf"rank {rank}: .*the launcher bound this one already", log):
                continue
            assert kinds.pop() == expected(rank), f"rank {rank} of {k} on CPUs {cpus}: not on {sorted(expected(rank))}\n{log}"
    finally:
        c.stop()
