"""The MPI roles' knobs: LAUNCHER_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

# The MPI launcher's and worker's knobs (trainer-launcher mpi, plan --framework mpi, local --mpi).
MPI_KNOBS: dict[str, Knob] = {
    "hostfile": Knob(
        "LAUNCHER_MPI_HOSTFILE",
        "--hostfile",
        "the Trainer hostfile; default: OMPI_MCA_orte_default_hostfile, PRTE_MCA_prte_default_hostfile, "
        "I_MPI_HYDRA_HOST_FILE, HYDRA_HOST_FILE, else /etc/mpi/hostfile",
    ),
    "default_slots": Knob(
        "LAUNCHER_MPI_DEFAULT_SLOTS",
        "--default-slots",
        "slots for a host line without a count; default OMPI_MCA_orte_set_default_slots, else 1",
    ),
    "implementation": Knob(
        "LAUNCHER_MPI_IMPLEMENTATION", "--implementation", "auto (from mpirun --version), openmpi, intel or mpich"
    ),
    "mpirun": Knob("LAUNCHER_MPIRUN", "--mpirun", "the mpirun/mpiexec to run; default the one on PATH"),
    "ssh_port": Knob("LAUNCHER_SSH_PORT", "--ssh-port", "the workers' sshd port; default 2222"),
    "ssh_auth_mount_path": Knob(
        "LAUNCHER_SSH_AUTH_MOUNT_PATH",
        "--ssh-auth-mount-path",
        "the read-only mount with id_rsa, id_rsa.pub, authorized_keys; default ~/.ssh",
    ),
    "ssh_dir": Knob(
        "LAUNCHER_SSH_DIR",
        "--ssh-dir",
        "a private writable directory for key copies and ssh/sshd configs; default ~/.trainer-launcher/ssh",
    ),
    "ssh_host_key_checking": Knob(
        "LAUNCHER_SSH_HOST_KEY_CHECKING",
        "--ssh-host-key-checking",
        "pinned (default): ssh reaches a worker only if its host key is the mounted Secret's, the key the "
        "worker role's sshd serves; off: accept any host key (for workers whose own sshd has host keys of "
        "its own), so a host on the pod network could pose as a worker",
    ),
    "ssh_listen_address": Knob(
        "LAUNCHER_SSH_LISTEN_ADDRESS", "--ssh-listen-address", "worker: the address sshd listens on; default all"
    ),
    "export": Knob(
        "LAUNCHER_MPI_EXPORT", "--export", "comma-separated globs of variables to export to every rank; default *"
    ),
    "export_deny": Knob(
        "LAUNCHER_MPI_EXPORT_DENY",
        "--export-deny",
        "comma-separated globs never exported, added to the built-in host-specific list",
    ),
    "abort_on_exception": Knob(
        "LAUNCHER_MPI_ABORT_ON_EXCEPTION",
        "--abort-on-exception",
        "run a Python program under mpi4py's runner so one failing rank aborts the job and is named (default 1)",
    ),
}
