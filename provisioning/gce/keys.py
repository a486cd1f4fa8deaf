"""The SSH key the orchestrator logs into its VMs with.

By default the tool uses a key pair of its own, generated on first use under the user's config
directory (`$XDG_CONFIG_HOME/transient-orchestrator/ssh/id_ed25519`, else `~/.config/...`):
ed25519, no passphrase, 0600 in a 0700 folder, its public half put into every VM's `ssh-keys`
metadata. The user's personal `~/.ssh/id_ed25519` is often passphrase-protected, and the
orchestrator logs in unattended (SkyPilot does the same with `~/.ssh/sky-key`). A key the user
configures (`provider.ssh_key`) is checked before any VM exists: missing, unreadable or
encrypted is one line naming the field (`key_problem`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TOOL_DIR = "transient-orchestrator"
KEY_NAME = "id_ed25519"


def tool_key_path() -> Path:
    """Where the tool's own private key lives (it may not exist yet)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / TOOL_DIR / "ssh" / KEY_NAME


def ensure_tool_key() -> Path:
    """The tool's private key, generated now when missing (safe against a concurrent run
    doing the same: the key appears whole or not at all, and the first one stays)."""
    path = tool_key_path()
    if path.is_file():
        return path
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    try:
        os.link(tmp, path)  # fails if another run made it meanwhile: keep that one
        path.with_suffix(".pub").write_bytes(public + b" transient-orchestrator\n")
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return path


def key_problem(path: str | Path) -> str | None:
    """Why the private key at `path` cannot log in unattended, or None when it can."""
    import paramiko

    file = Path(os.path.expanduser(str(path)))
    if not file.is_file():
        return f"no such key file '{file}' (leave provider.ssh_key unset to use the tool's own key)"
    try:
        paramiko.PKey.from_path(file)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's loader
        return (f"key '{file}' is passphrase-protected, and the orchestrator logs in unattended: "
                "leave provider.ssh_key unset to use the tool's own key, or give a key without "
                "a passphrase")
    except PermissionError:
        return f"key file '{file}' is not readable"
    except (paramiko.SSHException, ValueError, OSError) as error:
        return f"key '{file}' cannot be used ({' '.join(str(error).split())})"
    return None


def public_key_line(private: str | Path) -> str:
    """`<type> <base64>` of the key pair whose private half is at `private` (derived from it,
    so a missing or stale `.pub` does not matter)."""
    import paramiko

    key = paramiko.PKey.from_path(Path(os.path.expanduser(str(private))))
    return f"{key.get_name()} {key.get_base64()}"
