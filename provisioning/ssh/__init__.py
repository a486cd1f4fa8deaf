"""`provider=ssh`: roles on your own machines, reached over SSH (paramiko).

Modules: `config` (the typed options: inventory, placement, host keys, timeouts), `connection`
(one connection per machine, bounded commands, heartbeat), `runner` (detached roles, streamed
output, SFTP copy/fetch), `setup` (this project's wheel in a cached environment on each host),
`provider` (the `Provider` contract on top). Importing this package registers the backend.
"""

from provisioning.registry import register_provider
from provisioning.ssh.config import SshHostConfig, SshProviderConfig
from provisioning.ssh.provider import SshHostRunner, SshProvider

register_provider(SshProvider.name, SshProvider, SshProviderConfig)

__all__ = ["SshHostConfig", "SshHostRunner", "SshProvider", "SshProviderConfig"]
