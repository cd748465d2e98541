"""The tenant firewall's rules, as text: which packets from the platform's bridges are
refused, in what order, and how a rule of ours no longer wanted is found in iptables' own
listing. (The rules at work, on real iptables: tests/system/test_tenant_isolation.py.)"""

from __future__ import annotations

import shlex

import pytest

from hosts.runtime.container_spec import InvalidContainerSpec
from hosts.runtime.firewall import (
    BRIDGE_MATCH,
    install_script,
    is_platform_bridge,
    isolation_rules,
    new_bridge_name,
    parse_resolvers,
    stale_rules,
    uncovered_networks,
    validate_blocked_ranges,
)


def test_every_rule_matches_only_the_platforms_bridges():
    for rule in isolation_rules(["10.0.0.0/8"], ["169.254.169.254"]):
        assert rule.spec[:2] == ("-i", BRIDGE_MATCH), rule
        assert rule.chain in ("DOCKER-USER", "INPUT")


def test_replies_pass_before_anything_is_refused_and_members_of_a_group_still_talk():
    rules = isolation_rules(["192.168.0.0/16"], [])
    forward = [rule for rule in rules if rule.chain == "DOCKER-USER"]
    host = [rule for rule in rules if rule.chain == "INPUT"]
    assert "RELATED,ESTABLISHED" in forward[0].spec and forward[0].spec[-1] == "RETURN"
    # Traffic between platform bridges goes on to Docker's own rules (ICC, isolation).
    assert forward[1].spec[2:4] == ("-o", BRIDGE_MATCH) and forward[1].spec[-1] == "RETURN"
    assert [rule.spec[rule.spec.index("-d") + 1] for rule in forward[2:]] == [
        "169.254.0.0/16",
        "192.168.0.0/16",
    ]
    assert all(rule.spec[-1] == "REJECT" for rule in forward[2:])
    assert "RELATED,ESTABLISHED" in host[0].spec and host[0].spec[-1] == "ACCEPT"
    assert host[1].spec[-1] == "REJECT" and "-d" not in host[1].spec  # any host address


def test_dns_stays_open_to_a_resolver_inside_a_refused_range_and_only_there():
    rules = isolation_rules(["10.0.0.0/8"], ["169.254.169.254", "10.1.2.3", "8.8.8.8"])
    dns = [rule for rule in rules if "--dport" in rule.spec]
    assert {(rule.spec[rule.spec.index("-d") + 1], rule.spec[rule.spec.index("-p") + 1])
            for rule in dns} == {
        ("169.254.169.254/32", "udp"), ("169.254.169.254/32", "tcp"),
        ("10.1.2.3/32", "udp"), ("10.1.2.3/32", "tcp"),
    }  # fmt: skip
    first_refusal = next(i for i, rule in enumerate(rules) if rule.spec[-1] == "REJECT")
    assert all(rules.index(rule) < first_refusal for rule in dns)
    assert all(rule.spec[rule.spec.index("--dport") + 1] == "53" for rule in dns)


@pytest.mark.parametrize(
    "ranges, reason",
    [
        (["10.0.0.0/33"], "is not an IPv4 range"),
        (["fd00::/8"], "is not an IPv4 range"),
        (["10.0.0.0/8; reboot"], "is not an IPv4 range"),
        (["0.0.0.0/0"], "would cut rentals off"),
        ("10.0.0.0/8", "must be a list"),
        ([f"10.{i}.0.0/16" for i in range(33)], "at most 32"),
    ],
)
def test_bad_blocked_ranges_are_refused_naming_the_field(ranges, reason):
    with pytest.raises(InvalidContainerSpec) as caught:
        validate_blocked_ranges(ranges)
    assert caught.value.field == "blocked_ranges" and reason in caught.value.reason


def test_blocked_ranges_are_kept_canonical_and_once():
    assert validate_blocked_ranges([" 10.1.2.3/8", "10.0.0.0/8", "192.168.1.0/24"]) == [
        "10.0.0.0/8",
        "192.168.1.0/24",
    ]


def test_resolvers_are_read_from_resolv_conf():
    text = (
        "# generated\nnameserver 127.0.0.53\noptions edns0\nnameserver 169.254.169.254\n"
        "nameserver fe80::1%eth0\nnameserver 127.0.0.53\nsearch example.internal\n"
    )
    assert parse_resolvers(text) == ["127.0.0.53", "169.254.169.254"]


def test_a_rule_of_ours_no_longer_wanted_is_deleted_by_its_exact_text_and_no_other():
    wanted = isolation_rules(["10.0.0.0/8"], [])
    listing = "\n".join([
        "-N DOCKER-USER",
        '-A DOCKER-USER -i gpumkt-br+ -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "gpumkt isolation: replies" -j RETURN',
        '-A DOCKER-USER -d 172.16.0.0/12 -i gpumkt-br+ -m comment --comment "gpumkt isolation: refuse 172.16.0.0/12" -j REJECT --reject-with icmp-port-unreachable',
        '-A DOCKER-USER -d 10.9.9.9/32 -m comment --comment "the provider\'s own rule" -j DROP',
        "-A DOCKER-USER -j RETURN",
        "-P INPUT ACCEPT",
        '-A INPUT -i eth0 -m comment --comment "gpumkt isolation: replies" -j ACCEPT',
    ])  # fmt: skip
    assert stale_rules(listing, wanted, dropped=["172.16.0.0/12"]) == [
        ["-D", "DOCKER-USER", "-d", "172.16.0.0/12", "-i", "gpumkt-br+", "-m", "comment",
         "--comment", "gpumkt isolation: refuse 172.16.0.0/12", "-j", "REJECT",
         "--reject-with", "icmp-port-unreachable"],
    ]  # fmt: skip
    # A range this machine never set is another's on the same host: never deleted by it.
    assert stale_rules(listing, wanted) == []


def test_the_install_script_checks_each_rule_before_inserting_it_at_its_place():
    rules = isolation_rules([], [])
    lines = install_script(rules, []).splitlines()
    inserts = [line for line in lines if " -I " in line]
    assert len(inserts) == len(rules)
    place = {"DOCKER-USER": 0, "INPUT": 0}
    for line, rule in zip(inserts, rules, strict=True):
        place[rule.chain] += 1
        check, insert = line.split(" || ")
        assert shlex.split(check) == ["iptables", "-w", "-C", rule.chain, *rule.spec, "2>/dev/null"]
        assert shlex.split(insert) == ["iptables", "-w", "-I", rule.chain, str(place[rule.chain]),
                                       *rule.spec]  # fmt: skip
    # Never a flush, a chain made or removed, a policy changed.
    assert not any(f" {flag} " in line for line in lines for flag in ("-F", "-X", "-N", "-P"))


def test_platform_bridges_are_named_for_the_rules_and_older_networks_are_told():
    name = new_bridge_name()
    assert is_platform_bridge(name) and len(name) == 15 and name != new_bridge_name()
    assert not is_platform_bridge("br-0123456789ab") and not is_platform_bridge("gpumkt-qd0")
    listing = (
        "gpumkt-tenants gpumkt-br1a2b3c 3\ngpumkt-group-7  1\ngpumkt-old <no value> 2\n"
        "gpumkt-unused <no value> 0\n"
    )
    # Only networks this machine's containers use count: an unused one keeps no one apart.
    assert uncovered_networks(listing) == ["gpumkt-group-7", "gpumkt-old"]
