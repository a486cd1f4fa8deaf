"""Whether a VPC's firewall lets a run's traffic through, read before any VM (audit D2).

A custom network, a deleted `default-allow-ssh` or a rule narrowed to other tags otherwise shows
up only after boot, as 300 s of SSH retries ending in "no login within 300 s of boot", or as
workers that never reach the PS. The pre-flight reads the network's effective firewalls (one
`networks.getEffectiveFirewalls`) and evaluates the VPC rules as GCE does for ingress: of the
enabled rules that apply to the target and match the traffic, the one of lowest priority number
wins, a deny winning a tie, and traffic no rule allows is denied (the implied rule). Two flows
must pass:

- SSH (tcp:22) from the orchestrator to VMs with `provider.tags`. The orchestrator's address as
  Google sees it is not known here (a laptop behind NAT), so any rule whose source ranges take
  in public addresses counts (the passed line names the rule and its ranges, to compare with
  your address); source tags and private ranges match only traffic from inside the VPC, so
  they count only with `provider.inside_vpc`;
- the trainer's gRPC ports (`provider.trainer_port` and the next ones, one per role colocated
  on a VM) from tagged VMs to tagged VMs: a rule whose source tags share a tag, or whose source
  ranges cover private addresses.

Where it cannot be sure it lets the run go: rules naming service accounts count as matching for
an allow and as not matching for a deny, and a network with hierarchical or network firewall
policies (evaluated before VPC rules, with their own matching) is not judged (a passed line
says so).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: What private addresses (RFC 1918) the VMs' internal IPs are drawn from.
_PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                   "192.168.0.0/16"))
SSH_PORT = 22


@dataclass(frozen=True)
class FirewallRule:
    """One VPC firewall rule as getEffectiveFirewalls returns it."""

    name: str
    direction: str = "INGRESS"
    priority: int = 1000
    disabled: bool = False
    source_ranges: tuple[str, ...] = ()
    source_tags: tuple[str, ...] = ()
    source_service_accounts: tuple[str, ...] = ()
    target_tags: tuple[str, ...] = ()
    target_service_accounts: tuple[str, ...] = ()
    #: (protocol, port specs) allowed / denied; no port specs: every port
    allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    denied: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class EffectiveFirewalls:
    rules: list[FirewallRule] = field(default_factory=list)
    policies: int = 0  # hierarchical / network firewall policies with rules (not evaluated)


def _covers(specs: Iterable[tuple[str, tuple[str, ...]]], port: int) -> bool:
    """Whether (protocol, ports) entries cover tcp `port`."""
    for protocol, ports in specs:
        if protocol.lower() not in ("tcp", "all", "6"):
            continue
        if not ports:
            return True
        for spec in ports:
            low, _, high = spec.partition("-")
            if int(low) <= port <= int(high or low):
                return True
    return False


def _networks(ranges: Iterable[str]) -> list[ipaddress.IPv4Network]:
    nets = []
    for text in ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network):
            nets.append(net)
    return nets


def _private(ranges: Iterable[str]) -> bool:
    """Whether some range takes in private addresses (where VMs' internal IPs are)."""
    return any(net.overlaps(p) for net in _networks(ranges) for p in _PRIVATE)


def _public(ranges: Iterable[str]) -> bool:
    """Whether some range takes in public addresses (where a laptop's NAT address is)."""
    return any(not any(net.subnet_of(p) for p in _PRIVATE) for net in _networks(ranges))


def _deciding_rule(rules: Sequence[FirewallRule], tags: Sequence[str], port: int,
                   from_vms: bool, inside_vpc: bool) -> tuple[FirewallRule | None, bool]:
    """(the rule that decides tcp `port` to VMs tagged `tags`, whether it allows); (None,
    False) when only the implied deny applies. `from_vms`: traffic from tagged VMs (internal),
    else from the orchestrator."""

    def applies(rule: FirewallRule, allow: bool) -> bool:
        if rule.disabled or rule.direction.upper() != "INGRESS":
            return False
        if rule.target_tags:
            target = bool(set(rule.target_tags) & set(tags))
        else:  # no target tags: every VM, unless the rule names service accounts
            target = not rule.target_service_accounts or allow
        if not target:
            return False
        if from_vms:
            source = (bool(set(rule.source_tags) & set(tags)) or _private(rule.source_ranges)
                      or (allow and bool(rule.source_service_accounts)))
        elif inside_vpc:  # the orchestrator is a VM of the VPC: any source may be it
            source = bool(rule.source_ranges or rule.source_tags)
        else:
            source = _public(rule.source_ranges)
        return source and _covers(rule.allowed if allow else rule.denied, port)

    candidates = [(r.priority, 0 if not allow else 1, r, allow)
                  for r in rules for allow in (False, True) if applies(r, allow)]
    if not candidates:
        return None, False
    _, _, rule, allow = min(candidates, key=lambda c: (c[0], c[1]))
    return rule, allow


def firewall_lines(found: EffectiveFirewalls, network: str, tags: Sequence[str],
                   trainer_ports: Sequence[int], inside_vpc: bool
                   ) -> tuple[list[str], list[str]]:
    """(fits, short): one line per flow the run needs, passed or refused (the refusal says the
    gcloud command that adds the missing rule, as docs/gce.md)."""
    if found.policies:
        return [f"firewall of network {network}: {found.policies} firewall polic"
                f"{'y' if found.policies == 1 else 'ies'} apply, not evaluated here"], []
    fits: list[str] = []
    short: list[str] = []
    tag_list = ",".join(tags)
    rule, allowed = _deciding_rule(found.rules, tags, SSH_PORT, False, inside_vpc)
    if allowed and rule is not None:
        sources = ", ".join(rule.source_ranges) or ", ".join(rule.source_tags)
        fits.append(f"firewall of network {network}: tcp:22 to tags {tag_list} allowed by "
                    f"rule {rule.name} from {sources}")
    else:
        why = f"rule {rule.name} denies it" if rule is not None else "no rule allows it"
        short.append(f"provider.tags: the firewall of network {network} does not let SSH "
                     f"(tcp:22) from the orchestrator reach VMs tagged {tag_list} ({why}); "
                     f"add one: gcloud compute firewall-rules create transient-ps-ssh "
                     f"--network {network} --allow tcp:22 --target-tags {tag_list} "
                     f"--source-ranges YOUR_ADDRESS/32")
    ports = sorted(set(trainer_ports))
    blocked = []
    for port in ports:
        rule, allowed = _deciding_rule(found.rules, tags, port, True, inside_vpc)
        if not allowed:
            blocked.append(f"{port}" + (f" (rule {rule.name} denies it)" if rule else ""))
    span = f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else f"{ports[0]}"
    if blocked:
        short.append(f"provider.trainer_port: the firewall of network {network} does not let "
                     f"the trainer's gRPC ports between VMs tagged {tag_list} through (tcp "
                     f"{', '.join(blocked)}); add one: gcloud compute firewall-rules create "
                     f"transient-ps-grpc --network {network} --allow tcp:{span} "
                     f"--target-tags {tag_list} --source-tags {tag_list}")
    else:
        fits.append(f"firewall of network {network}: tcp:{span} between VMs tagged {tag_list} "
                    "allowed")
    return fits, short
