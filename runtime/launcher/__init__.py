"""The in-job launcher (`train`): the /opt/ml contract, runners and mpirun across hosts."""
