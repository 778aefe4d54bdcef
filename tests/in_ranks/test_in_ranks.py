"""Tests that run inside MPI ranks (pytest-mpi): `mpiexec -n 2 python -m pytest --with-mpi tests/in_ranks`.
Without --with-mpi (the plain test run) they are skipped."""

import pytest


@pytest.mark.mpi(min_size=2)
def test_every_rank_sees_the_same_world_and_sums_correctly():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2
    assert comm.allgather(comm.Get_size()) == [comm.Get_size()] * comm.Get_size()


@pytest.mark.mpi(min_size=2)
def test_a_broadcast_from_rank_0_reaches_every_rank():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.bcast({"plan": "ok"} if comm.Get_rank() == 0 else None, root=0) == {"plan": "ok"}
