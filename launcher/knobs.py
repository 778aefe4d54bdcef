"""The launcher's own knobs: one table for the LAUNCHER_* variables and their CLI flags.

Kept free of pydantic so the CLI can parse its flags (and start the torch agent) before the
validation machinery is imported; launcher.settings validates the values.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Override(NamedTuple):
    """A value given on the command line, which wins over the environment."""

    value: Any
    source: str  # the flag as the user typed it, e.g. "--grace-period" or "--nnodes"


class Knob(NamedTuple):
    env: str
    flag: str
    help: str


KNOBS: dict[str, Knob] = {
    "rendezvous_timeout": Knob(
        "LAUNCHER_RENDEZVOUS_TIMEOUT", "--rendezvous-timeout",
        "how long to wait for the master's DNS name and port before failing retryably (138); default 600s"),
    "grace_period": Knob(
        "LAUNCHER_GRACE_PERIOD", "--grace-period",
        "on teardown, SIGTERM-to-SIGKILL grace; keep it below terminationGracePeriodSeconds; default 25s"),
    "termination_log": Knob(
        "LAUNCHER_TERMINATION_LOG", "--termination-log",
        "where to write the JSON termination message; default /dev/termination-log when it exists"),
    "retryable_exit_codes": Knob(
        "LAUNCHER_RETRYABLE_EXIT_CODES", "--retryable-exit-codes",
        "exit codes that are retryable; default 130,137,138,143"),
    "retryable_pattern": Knob(
        "LAUNCHER_RETRYABLE_PATTERN", "--retryable-pattern",
        "a regex: failures whose output matches it (or the built-in NCCL/ECC/Xid patterns) exit 138"),
    "log_format": Knob("LAUNCHER_LOG_FORMAT", "--log-format", "the launcher's own log lines: text or json"),
    "keep_nproc": Knob(
        "LAUNCHER_KEEP_NPROC", "--keep-nproc",
        "1: run PET_NPROC_PER_NODE processes even when fewer accelerators are visible; "
        "default 0: one process per visible accelerator"),
}

# The MPI launcher's and worker's knobs (trainer-launcher mpi, plan --framework mpi, local --mpi).
MPI_KNOBS: dict[str, Knob] = {
    "hostfile": Knob(
        "LAUNCHER_MPI_HOSTFILE", "--hostfile",
        "the Trainer hostfile; default: OMPI_MCA_orte_default_hostfile, PRTE_MCA_prte_default_hostfile, "
        "I_MPI_HYDRA_HOST_FILE, HYDRA_HOST_FILE, else /etc/mpi/hostfile"),
    "default_slots": Knob(
        "LAUNCHER_MPI_DEFAULT_SLOTS", "--default-slots",
        "slots for a host line without a count; default OMPI_MCA_orte_set_default_slots, else 1"),
    "implementation": Knob(
        "LAUNCHER_MPI_IMPLEMENTATION", "--implementation",
        "auto (from mpirun --version), openmpi, intel or mpich"),
    "mpirun": Knob("LAUNCHER_MPIRUN", "--mpirun", "the mpirun/mpiexec to run; default the one on PATH"),
    "ssh_port": Knob("LAUNCHER_SSH_PORT", "--ssh-port", "the workers' sshd port; default 2222"),
    "ssh_auth_mount_path": Knob(
        "LAUNCHER_SSH_AUTH_MOUNT_PATH", "--ssh-auth-mount-path",
        "the read-only mount with id_rsa, id_rsa.pub, authorized_keys; default ~/.ssh"),
    "ssh_dir": Knob(
        "LAUNCHER_SSH_DIR", "--ssh-dir",
        "a private writable directory for key copies and ssh/sshd configs; default ~/.trainer-launcher/ssh"),
    "ssh_listen_address": Knob(
        "LAUNCHER_SSH_LISTEN_ADDRESS", "--ssh-listen-address", "worker: the address sshd listens on; default all"),
    "export": Knob(
        "LAUNCHER_MPI_EXPORT", "--export",
        "comma-separated globs of variables to export to every rank; default *"),
    "export_deny": Knob(
        "LAUNCHER_MPI_EXPORT_DENY", "--export-deny",
        "comma-separated globs never exported, added to the built-in host-specific list"),
    "abort_on_exception": Knob(
        "LAUNCHER_MPI_ABORT_ON_EXCEPTION", "--abort-on-exception",
        "run a Python program under mpi4py's runner so one failing rank aborts the job and is named (default 1)"),
}

# The initializers' own knobs (trainer-launcher init dataset|model); the upstream variables
# (STORAGE_URI, IGNORE_PATTERNS, ACCESS_TOKEN, ENDPOINT, ...) keep their names and have no flags.
INIT_KNOBS: dict[str, Knob] = {
    "output_path": Knob("LAUNCHER_INIT_OUTPUT", "--output",
                        "target directory; default OUTPUT_PATH, else /workspace/dataset or /workspace/model"),
    "revision": Knob("LAUNCHER_INIT_REVISION", "--revision", "hf: the branch, tag or commit to fetch (default main)"),
    "concurrency": Knob("LAUNCHER_INIT_CONCURRENCY", "--concurrency", "parallel transfers (default 8)"),
    "chunk_size": Knob("LAUNCHER_INIT_CHUNK_SIZE", "--chunk-size", "bytes per read (default 8 MiB)"),
    "retries": Knob("LAUNCHER_INIT_RETRIES", "--retries", "attempts per file after the first, with backoff (default 6)"),
    "ranged_min": Knob("LAUNCHER_INIT_RANGED_MIN", "--ranged-min",
                       "files this big (bytes) are fetched as parallel byte ranges (default 64 MiB)"),
    "extract": Knob("LAUNCHER_INIT_EXTRACT", "--extract", "https: extract a .tar.gz/.tgz/.zip into the target (1/0)"),
}

# The smoke test's thresholds (trainer-launcher smoke).
SMOKE_KNOBS: dict[str, Knob] = {
    "min_shm_gb": Knob("LAUNCHER_SMOKE_MIN_SHM_GB", "--min-shm-gb", "fail below this /dev/shm size (default 1)"),
    "min_free_gb": Knob("LAUNCHER_SMOKE_MIN_FREE_GB", "--min-free-gb", "warn below this free space on /workspace (default 10)"),
    "min_matmul_gflops": Knob("LAUNCHER_SMOKE_MIN_MATMUL_GFLOPS", "--min-matmul-gflops",
                              "fail below this fp32 CPU matmul rate (default 1)"),
    "min_bf16_tflops": Knob("LAUNCHER_SMOKE_MIN_BF16_TFLOPS", "--min-bf16-tflops",
                            "fail below this bf16 GPU matmul rate per GPU (default 100)"),
    "min_copy_gbps": Knob("LAUNCHER_SMOKE_MIN_COPY_GBPS", "--min-copy-gbps",
                          "fail below this device-to-device copy rate per GPU, GB/s read+write (default 500)"),
    "min_busbw_gbps": Knob("LAUNCHER_SMOKE_MIN_BUSBW_GBPS", "--min-busbw-gbps",
                           "fail below this NCCL all-reduce bus bandwidth, GB/s (default 10)"),
}
