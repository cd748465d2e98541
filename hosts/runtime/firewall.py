"""The host's firewall for rentals: what a tenant container may not open a connection to.

Every platform network is a bridge named ``gpumkt-br`` + six hex digits (given at its
creation, ``BRIDGE_NAME_OPTION``), so one set of rules, matched on ``-i gpumkt-br+``, covers
every rental on the machine, today's networks and tomorrow's, and touches nothing else on the
host (its own containers, other bridges, the provider's traffic). From such a bridge:

- ``INPUT`` (packets for the host itself, on any of its addresses: the bridge's gateway, its
  public and LAN addresses): only replies to connections the host opened (Docker's port
  proxy, the platform's gateway) pass; a new connection is refused.
- ``DOCKER-USER`` (Docker's chain for forwarded packets, checked before its own): replies pass
  first (a published port's answer to a client on the provider's LAN); traffic between two
  platform bridges or inside one goes on to Docker's own rules (a group's members talk, the
  tenants' bridge keeps ICC off, two bridges stay apart); then link-local ``169.254.0.0/16``
  (a cloud's metadata service) and the private ranges the provider names are refused. DNS to
  the host's own resolvers stays open when one lives there (a cloud's resolver at
  169.254.169.254, a LAN resolver), since Docker's embedded DNS asks them from inside the
  container.

Rules are refused with ``REJECT`` so a program fails at once instead of waiting out a timeout.
Each carries a comment starting ``gpumkt isolation``: it is checked (``iptables -C``) before
it is inserted, at its place in the list, so running the setup again adds nothing, and a
rule of ours no longer wanted (a range the provider dropped) is deleted by its exact text.
No chain is ever flushed or made. IPv4 only: platform networks have no IPv6.
"""

from __future__ import annotations

import ipaddress
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from hosts import ssh
from hosts.runtime.container_spec import MACHINE_LABEL, PLATFORM_LABEL, InvalidContainerSpec

if TYPE_CHECKING:
    from hosts.models import Machine

# Linux interface names hold 15 characters: the prefix and six hex digits.
BRIDGE_PREFIX = "gpumkt-br"
BRIDGE_MATCH = BRIDGE_PREFIX + "+"
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
COMMENT = "gpumkt isolation"
LINK_LOCAL = "169.254.0.0/16"
MAX_BLOCKED_RANGES = 32

# Where the host's resolvers are written: the classic file, and systemd-resolved's list of the
# real upstreams (Docker reads the latter when the former names only 127.0.0.53).
RESOLV_FILES = ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf")


def new_bridge_name() -> str:
    """A platform bridge's interface name: random, so two Docker engines sharing a network
    namespace (the simulated hosts) never adopt each other's bridge."""
    return BRIDGE_PREFIX + secrets.token_hex(3)


def is_platform_bridge(name: str) -> bool:
    return name.startswith(BRIDGE_PREFIX) and len(name) <= 15


def validate_blocked_ranges(values: object) -> list[str]:
    """The provider's private ranges as IPv4 CIDRs (``10.0.0.0/8``, ``192.168.1.0/24``), in
    their canonical form; InvalidContainerSpec names the field and the bad entry."""
    if not isinstance(values, list | tuple):
        raise InvalidContainerSpec("blocked_ranges", "must be a list of address ranges")
    if len(values) > MAX_BLOCKED_RANGES:
        raise InvalidContainerSpec("blocked_ranges", f"at most {MAX_BLOCKED_RANGES} ranges")
    ranges: list[str] = []
    for value in values:
        try:
            network = ipaddress.IPv4Network(str(value).strip(), strict=False)
        except ValueError:
            raise InvalidContainerSpec(
                "blocked_ranges", f"'{str(value)[:40]}' is not an IPv4 range like 10.0.0.0/8"
            ) from None
        if network.prefixlen == 0:
            raise InvalidContainerSpec("blocked_ranges", "0.0.0.0/0 would cut rentals off")
        if str(network) not in ranges:
            ranges.append(str(network))
    return ranges


def parse_resolvers(text: str) -> list[str]:
    """The IPv4 ``nameserver`` lines of resolv.conf files, in order, without repeats."""
    found: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                address = str(ipaddress.IPv4Address(parts[1]))
            except ValueError:
                continue
            if address not in found:
                found.append(address)
    return found


@dataclass(frozen=True)
class Rule:
    chain: str
    spec: tuple[str, ...]

    @property
    def comment(self) -> str:
        return self.spec[self.spec.index("--comment") + 1]


def _rule(chain: str, why: str, *matches: str, target: str) -> Rule:
    return Rule(
        chain,
        ("-i", BRIDGE_MATCH, *matches, "-m", "comment", "--comment", f"{COMMENT}: {why}",
         "-j", target),
    )  # fmt: skip


def isolation_rules(blocked: list[str], resolvers: list[str]) -> list[Rule]:
    """The rules, in the order they must stand at the top of each chain."""
    replies = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED")
    refused = [LINK_LOCAL, *blocked]
    dns = [
        address
        for address in resolvers
        if any(ipaddress.IPv4Address(address) in ipaddress.IPv4Network(r) for r in refused)
    ]
    forward = [
        _rule("DOCKER-USER", "replies", *replies, target="RETURN"),
        _rule("DOCKER-USER", "platform bridges", "-o", BRIDGE_MATCH, target="RETURN"),
        *(
            _rule(
                "DOCKER-USER",
                f"dns {address} {protocol}",
                "-d",
                f"{address}/32",
                "-p",
                protocol,
                "--dport",
                "53",
                target="RETURN",
            )
            for address in dns
            for protocol in ("udp", "tcp")
        ),  # fmt: skip
        *(_rule("DOCKER-USER", f"refuse {r}", "-d", r, target="REJECT") for r in refused),
    ]
    host = [
        _rule("INPUT", "replies", *replies, target="ACCEPT"),
        _rule("INPUT", "refuse the host", target="REJECT"),
    ]
    return forward + host


def stale_rules(
    listing: str, wanted: list[Rule], dropped: Iterable[str] | None = None
) -> list[list[str]]:
    """``iptables -D`` arguments for each rule of ours in an ``iptables -S`` listing that is
    no longer wanted, told by its comment; rules of anyone else are never named. A range's
    refusal is stale only when it is among ``dropped`` (ranges this machine set and its
    provider dropped): another machine on the same host may want it."""
    wanted_comments = {(rule.chain, rule.comment) for rule in wanted}
    dropped_comments = {f"{COMMENT}: refuse {r}" for r in (dropped or ())}
    stale = []
    for line in listing.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if len(words) < 2 or words[0] != "-A" or "--comment" not in words:
            continue
        comment = words[words.index("--comment") + 1] if words[-1] != "--comment" else ""
        if not comment.startswith(COMMENT) or (words[1], comment) in wanted_comments:
            continue
        if comment.startswith(f"{COMMENT}: refuse ") and comment not in dropped_comments:
            continue  # another machine's range, perhaps: not this probe's to delete
        stale.append(["-D", *words[1:]])
    return stale


# $@ the resolv.conf files. The iptables tool and Docker's chain must be there before
# anything; then the resolvers, our chains' rules, and each platform network's bridge.
_READ = f"""command -v iptables >/dev/null 2>&1 || {{ echo "iptables is not installed" >&2; exit 3; }}
said=$(iptables -w -S DOCKER-USER 2>&1) || {{
  echo "iptables cannot read Docker's DOCKER-USER chain (is Docker managing iptables?): $said" >&2
  exit 4; }}
for f in "$@"; do [ -r "$f" ] && cat "$f"; done; echo "--- rules"
iptables -w -S DOCKER-USER && iptables -w -S INPUT || exit 5
echo "--- networks"
docker network ls --quiet --filter label={PLATFORM_LABEL}=1 | while read -r id; do
  printf '%s %s\n' \
    "$(docker network inspect --format '{{{{.Name}}}} {{{{index .Options "{BRIDGE_NAME_OPTION}"}}}}' "$id")" \
    "$(docker ps --quiet --filter network="$id" $OURS | wc -l)"
done
"""


def install_script(rules: list[Rule], stale: list[list[str]]) -> str:
    """The shell lines that make the chains hold ``rules`` at their top, in order: each is
    checked, inserted at its place only when missing, and checked again. Two setups of one
    host at once (a probe and a self-test) take turns, so neither inserts a rule twice."""
    lines = [
        "set -e",
        'exec 9>>"$HOME/.gpumkt-firewall.lock"',
        "if command -v flock >/dev/null; then flock 9; fi",
    ]
    for words in stale:
        lines.append(f"iptables -w {shlex.join(words)} || true")  # gone meanwhile: fine
    position = {"DOCKER-USER": 0, "INPUT": 0}
    for rule in rules:
        position[rule.chain] += 1
        spec = shlex.join(rule.spec)
        lines.append(
            f"iptables -w -C {rule.chain} {spec} 2>/dev/null || "
            f"iptables -w -I {rule.chain} {position[rule.chain]} {spec}"
        )
    for rule in rules:
        lines.append(f"iptables -w -C {rule.chain} {shlex.join(rule.spec)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FirewallState:
    ok: bool
    detail: str  # what is missing, or what is in place

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", self.detail[:300])  # as the machine keeps it


def _failure(result: ssh.CommandResult) -> str:
    said = (result.stderr or result.stdout).strip().splitlines()
    return said[-1][:200] if said else f"exit status {result.exit_code}"


def uncovered_networks(listing: str) -> list[str]:
    """Platform networks (``name bridge containers`` lines: the last, how many of this
    machine's containers run on it) whose bridge the rules do not match while containers of
    this machine use them: made before the firewall, they are made again once none does. One
    no container of ours uses holds no rental to keep apart (and on a host several machines
    or installations share, it may be another's)."""
    names = []
    for line in listing.splitlines():
        words = line.split()
        if len(words) < 2 or not words[-1].isdigit() or int(words[-1]) == 0:
            continue
        if not is_platform_bridge(words[1] if len(words) == 3 else ""):
            names.append(words[0])
    return names


def _ours_filters(machine: Machine) -> str:
    """``docker ps`` filters for this machine's containers (and this installation's labels)."""
    labels = {MACHINE_LABEL: str(machine.pk), **getattr(settings, "CONTAINER_EXTRA_LABELS", {})}
    return " ".join(f"--filter=label={k}={v}" for k, v in sorted(labels.items()))


def firewall_ensure(machine: Machine) -> FirewallState:
    """Install (idempotently) the rules that keep rentals off the host, link-local addresses
    and the machine's ``blocked_ranges``; say whether they are all in place. Only losing the
    machine (HostUnreachable, HostKeyMismatch) raises."""
    blocked = validate_blocked_ranges(list(machine.blocked_ranges or []))
    read = ssh.run(
        machine, ["sh", "-c", f"OURS={shlex.quote(_ours_filters(machine))}\n" + _READ, "sh",
                  *RESOLV_FILES],
        check=False,
    )  # fmt: skip
    if read.exit_code != 0:
        return FirewallState(False, f"Tenant firewall not installed: {_failure(read)}")
    resolv, _, rest = read.stdout.partition("--- rules\n")
    listing, _, networks = rest.partition("--- networks\n")
    rules = isolation_rules(blocked, parse_resolvers(resolv))
    dropped = set(machine.firewall_ranges or []) - set(blocked)
    script = install_script(rules, stale_rules(listing, rules, dropped))
    done = ssh.run(machine, ["sh", "-c", script], check=False)
    if done.exit_code != 0:
        return FirewallState(False, f"Tenant firewall incomplete: {_failure(done)}")
    if uncovered := uncovered_networks(networks):
        return FirewallState(
            False,
            f"Network(s) {', '.join(uncovered)} predate the tenant firewall; each is made "
            "again, inside it, once no container uses it",
        )
    refused = ", ".join([LINK_LOCAL, *blocked])
    return FirewallState(True, f"Rentals cannot reach the host, {refused}")
