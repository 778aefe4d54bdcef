"""The node preflight: CPU/GPU, shm, disk, DNS, gloo/NCCL against thresholds."""
