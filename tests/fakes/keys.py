"""Throwaway SSH keys for tests and benchmarks (never used outside loopback fakes)."""

from __future__ import annotations

from pathlib import Path


def write_ssh_key(directory: Path) -> Path:
    """A fresh ed25519 key pair in OpenSSH format in `directory`; returns the private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    path = Path(directory) / "id_ed25519"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    path.with_suffix(".pub").write_bytes(public + b" test@fake\n")
    return path
