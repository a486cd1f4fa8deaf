"""`provider=ssh`: roles on your own machines, reached over SSH (paramiko).

Modules: `config` (the typed options: inventory, placement, host keys, timeouts), `connection`
(one connection per machine, bounded commands, heartbeat), `runner` (detached roles, streamed
output, SFTP copy/fetch), `setup` (this project's wheel in a cached environment on each host),
`machine` (one machine's connection, reconnection and loss), `host_runner` (one host's roles on
its machine), `provider` (the `Provider` contract on top). Importing this package registers the backend with
its typed config; paramiko loads with `provider`, when a provider is built or its class read
(a local run composes every backend's schema and needs none of it).
"""

from provisioning.registry import register_provider
from provisioning.ssh.config import SshHostConfig, SshProviderConfig

register_provider("ssh", "provisioning.ssh.provider:SshProvider", SshProviderConfig)

__all__ = ["SshHostConfig", "SshProviderConfig"]
