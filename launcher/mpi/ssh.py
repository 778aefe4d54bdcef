"""ssh for MPI without root: private copies of the mounted keys, an sshd config for the worker,
a client config and wrapper for the launcher, and the Secret's public key that the launcher pins
as every worker's host key.

Trainer mounts the Secret read-only (private key mode 0640, root-owned); ssh and sshd refuse a
private key others can read, and a non-root sshd cannot use /etc/ssh. So both roles copy what
they need into a private directory with the modes ssh demands.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from launcher.core.outcome import ConfigError
from launcher.mpi.plan import PUBLIC_KEY_LINE

PRIVATE_KEY = "id_rsa"  # the Trainer's name; the key itself is ECDSA P-521
PUBLIC_KEY = "id_rsa.pub"
AUTHORIZED_KEYS = "authorized_keys"


def sshd_config(
    private_dir: str, port: int, listen_address: str | None, is_root: bool, session_env: dict[str, str] | None = None
) -> str:
    """``session_env``: variables every ssh session gets. sshd starts sessions with a bare
    environment, so the image's PATH (where mpirun's remote daemons live) would be lost."""
    lines = [
        "# written by trainer-launcher: the worker's sshd",
        f"Port {port}",
        *([f"ListenAddress {listen_address}"] if listen_address else []),
        f"HostKey {os.path.join(private_dir, 'id_key')}",  # the private key doubles as host key
        f"AuthorizedKeysFile {os.path.join(private_dir, AUTHORIZED_KEYS)}",
        f"PidFile {os.path.join(private_dir, 'sshd.pid')}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        f"PermitRootLogin {'prohibit-password' if is_root else 'no'}",
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "PrintMotd no",
        "LogLevel ERROR",
    ]
    if session_env:
        lines.append("SetEnv " + " ".join(f'{k}="{v}"' for k, v in sorted(session_env.items())))
    return "\n".join(lines) + "\n"


def write_private(path: str, data: bytes | str, mode: int = 0o600) -> None:
    """Write atomically with ``mode`` from the start (never world-readable, even briefly)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def install_keys(mount: str, private_dir: str, source: str = "LAUNCHER_SSH_AUTH_MOUNT_PATH") -> None:
    """Copy the mounted key into ``private_dir/id_key`` (0600) and the authorized keys (or, failing
    that, the public key) into ``private_dir/authorized_keys``."""

    def read(name: str) -> bytes | None:
        path = os.path.join(mount, name)
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except PermissionError:
            raise ConfigError(
                source,
                mount,
                f"{name} readable by uid {os.getuid()} (mount the Secret with defaultMode 0640 and fsGroup)",
            ) from None

    def required(name: str) -> bytes:
        data = read(name)
        if data is None:
            raise ConfigError(source, mount, f"a directory holding {name} (the Trainer's ssh Secret)")
        return data

    key = required(PRIVATE_KEY)
    authorized = read(AUTHORIZED_KEYS) or required(PUBLIC_KEY)
    write_private(os.path.join(private_dir, "id_key"), key)
    write_private(os.path.join(private_dir, AUTHORIZED_KEYS), authorized)


def mounted_public_key(mount: str, private_dir: str, source: str = "LAUNCHER_SSH_AUTH_MOUNT_PATH") -> str:
    """The Secret's public key line: ``id_rsa.pub`` from the mount, or, where the Secret lacks it,
    derived (``ssh-keygen -y``) from the private copy :func:`install_keys` wrote into
    ``private_dir``. Reads only; writes nothing."""
    path = os.path.join(mount, PUBLIC_KEY)
    try:
        with open(path, encoding="utf-8") as handle:
            key, origin = handle.read(), path
    except FileNotFoundError:
        key, origin = _derived_public_key(os.path.join(private_dir, "id_key"), mount, source), "ssh-keygen -y"
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or error
        raise ConfigError(source, mount, f"a readable {PUBLIC_KEY} ({why})") from None
    if not PUBLIC_KEY_LINE.fullmatch(key):
        raise ConfigError(
            source, mount, f"{PUBLIC_KEY} holding one OpenSSH public key, TYPE BASE64 [COMMENT] (from {origin})"
        )
    return key


def _derived_public_key(private_key: str, mount: str, source: str) -> str:
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise ConfigError(source, mount, f"{PUBLIC_KEY}, or ssh-keygen on PATH to derive it from {PRIVATE_KEY}")
    try:
        result = subprocess.run(
            [keygen, "-y", "-f", private_key], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(source, mount, f"{PUBLIC_KEY}, or a {PRIVATE_KEY} ssh-keygen -y reads within 30 s") from None
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(source, mount, f"{PUBLIC_KEY}, or a {PRIVATE_KEY} ssh-keygen -y reads ({said})")
    return result.stdout
