"""Parsing the rank environment set by shoal-rank, torchrun or a plain mpirun."""

import datetime

import pytest
from shoal.dataparallel.torch import environment, rendezvous
from shoal.errors import ValidationError


def test_torch_names_win_over_open_mpi():
    env = environment.from_environ(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "8",
            "MASTER_ADDR": "algo-1",
            "MASTER_PORT": "7777",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port) == ("algo-1", 7777)
    assert env.is_distributed


def test_plain_mpirun():
    env = environment.from_environ(
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_size) == (2, 3, 2, 3)
    assert env.master_addr == "127.0.0.1"
    assert env.master_port is None
    assert environment.started_by_a_launcher({"OMPI_COMM_WORLD_RANK": "2"})


def test_no_starter_is_a_world_of_one():
    env = environment.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.local_size) == (0, 1, 0, 1)
    assert not env.is_distributed
    assert not environment.started_by_a_launcher({})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "'rank' must be >= 0 and < world_size 4 (got 4)"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "'RANK' must be an integer (got 'x')"),
        ({"WORLD_SIZE": "0"}, "'world_size' must be >= 1"),
        ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "'local_rank' must be >= 0 and < local_size 2 (got 2)"),
        ({"MASTER_PORT": "70000"}, "'master_port' must be in 1..65535 (got 70000)"),
        ({"MASTER_PORT": "http"}, "'MASTER_PORT' must be an integer (got 'http')"),
    ],
)
def test_bad_values_name_the_variable(variables, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        environment.from_environ(variables)


def test_collective_timeout():
    assert rendezvous.collective_timeout({}) == datetime.timedelta(minutes=30)
    assert rendezvous.collective_timeout({"SHOAL_COLLECTIVE_TIMEOUT": "7.5"}) == datetime.timedelta(
        seconds=7.5
    )
    with pytest.raises(ValidationError, match="must be > 0"):
        rendezvous.collective_timeout({"SHOAL_COLLECTIVE_TIMEOUT": "0"})
    with pytest.raises(ValidationError, match="must be a number"):
        rendezvous.collective_timeout({"SHOAL_COLLECTIVE_TIMEOUT": "soon"})
