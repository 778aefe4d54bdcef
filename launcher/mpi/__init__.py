"""MPI: the Trainer hostfile turned into what Open MPI (4 and 5), Intel MPI and MPICH need."""
