"""Bench: one metering sweep over 100,000 running contracts (open holds) on PostgreSQL.

Budget (DESIGN.md): a sweep over 100,000 running contracts in ≤ 10 s.

    DATABASE_URL=postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench .venv/bin/python bench/metering.py

It creates its own scratch database (the name must contain "bench"; an old one is dropped),
migrates it, bulk-inserts the holds, runs ``billing.services.holds_settle_usage`` twice — the
second time with unchanged usage, which must capture nothing — checks the ledger, prints the
figures, and drops the database. ``BENCH_HOLDS`` changes the size.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench")
os.environ.setdefault("DB_CONN_MAX_AGE", "0")

HOLDS = int(os.environ.get("BENCH_HOLDS", "100000"))
RENTER_TEAMS = max(1, HOLDS // 50)
PROVIDER_TEAMS = max(1, HOLDS // 500)
BUDGET_S = 10.0


def scratch_database(url: str) -> tuple[dict, str]:
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(url)
    name = config["NAME"]
    if "bench" not in name:
        sys.exit(
            f"Refusing to use database {name!r}: the bench's database name must contain 'bench'."
        )
    admin = psycopg.connect(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"],
        password=config["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    )
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    return config, name


def drop_database(config: dict, name: str) -> None:
    import psycopg

    with psycopg.connect(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"],
        password=config["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def populate(rng: random.Random) -> list:
    """Teams, 100,000 open holds and a balanced setup transfer that funds their held credit."""
    from django.db import transaction
    from django.utils import timezone

    from billing.models import Account, AccountKind, Entry, Hold, Transfer, TransferKind
    from billing.money import usage_owed
    from billing.services import UsageOwed
    from marketplace.models import Team

    now = timezone.now()
    with transaction.atomic():
        renters = Team.objects.bulk_create(Team(name=f"renter {i}") for i in range(RENTER_TEAMS))
        providers = Team.objects.bulk_create(
            Team(name=f"provider {i}") for i in range(PROVIDER_TEAMS)
        )
        holds, items, held = [], [], {}
        for n in range(HOLDS):
            renter = renters[n % len(renters)]
            rate = rng.randrange(200_000, 3_000_000)  # $0.20–$3.00 per GPU-hour
            amount = rate * 24  # a day's rental
            holds.append(
                Hold(
                    team_id=renter.pk,
                    provider_team_id=providers[n % len(providers)].pk,
                    reference=f"contract:{n}",
                    machine_reference=f"machine:{n % (len(providers) * 4)}",
                    idempotency_key=f"bench-hold-{n}",
                    amount=amount,
                    created_at=now,
                )
            )
            held[renter.pk] = held.get(renter.pk, 0) + amount
        holds = Hold.objects.bulk_create(holds, batch_size=10_000)
        for hold in holds:
            seconds = rng.randrange(60, 3 * 3600)
            rate = hold.amount // 24
            items.append(UsageOwed(hold.pk, "gpu", usage_owed(rate_per_hour=rate, seconds=seconds)))
            if hold.pk % 2:
                items.append(
                    UsageOwed(hold.pk, "storage", usage_owed(rate_per_hour=5_000, seconds=seconds))
                )

        grants = Account.objects.create(kind=AccountKind.GRANTS, balance=-sum(held.values()))
        accounts = Account.objects.bulk_create(
            [Account(team_id=t, kind=AccountKind.HELD, balance=b) for t, b in held.items()]
            + [Account(team_id=t.pk, kind=AccountKind.AVAILABLE) for t in renters]
            + [Account(team_id=t.pk, kind=AccountKind.EARNINGS) for t in providers]
            + [Account(kind=AccountKind.PLATFORM_REVENUE)]
        )
        setup = Transfer.objects.create(
            kind=TransferKind.GRANT, idempotency_key="bench-setup", amount=-grants.balance,
            reference="bench", description="Funds the bench's holds", created_at=now,
        )  # fmt: skip
        Entry.objects.bulk_create(
            [Entry(transfer=setup, account=grants, account_kind=grants.kind, amount=grants.balance,
                   balance_after=grants.balance, created_at=now)]
            + [Entry(transfer=setup, account=a, team_id=a.team_id, account_kind=a.kind, amount=a.balance,
                     balance_after=a.balance, created_at=now) for a in accounts if a.balance]
        )  # fmt: skip
    return items


def ledger_balanced() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT transfer_id FROM billing_entry GROUP BY transfer_id"
            " HAVING sum(amount) <> 0) AS bad"
        )
        unbalanced = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*) FROM billing_account a WHERE a.balance <> "
            "(SELECT coalesce(sum(e.amount), 0) FROM billing_entry e WHERE e.account_id = a.id)"
        )
        drifted = cursor.fetchone()[0]
    return unbalanced == 0 and drifted == 0


def main() -> None:
    config, name = scratch_database(os.environ["DATABASE_URL"])
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from billing.money import format_usd
        from billing.services import SETTLE_BATCH_SIZE, holds_settle_usage
        from billing.signals import balance_changed

        # Measure the ledger, not console pushes: no receivers (nobody is watching).
        balance_changed.receivers.clear()
        call_command("migrate", verbosity=0)
        print(f"database {name}: {HOLDS:,} open holds, {RENTER_TEAMS:,} renter teams, "
              f"{PROVIDER_TEAMS:,} provider teams, batches of {SETTLE_BATCH_SIZE:,}")  # fmt: skip
        started = time.perf_counter()
        items = populate(random.Random(42))
        print(f"setup: {time.perf_counter() - started:.1f} s ({len(items):,} usage items)")

        started = time.perf_counter()
        captured = holds_settle_usage(items)
        first = time.perf_counter() - started
        started = time.perf_counter()
        again = holds_settle_usage(items)
        second = time.perf_counter() - started

        ok = ledger_balanced()
        print(
            f"sweep 1: {first:.2f} s, {HOLDS / first:,.0f} holds/s, captured {format_usd(captured)}"
        )
        print(f"sweep 2 (unchanged usage): {second:.2f} s, captured {format_usd(again)}"
              f"{'  OK: nothing twice' if again == 0 else '  WRONG: captured twice'}")  # fmt: skip
        print(f"ledger balanced and balances = sum of entries: {'yes' if ok else 'NO'}")
        scale = 100_000 / HOLDS
        print(f"budget: ≤ {BUDGET_S:.0f} s for 100,000 running contracts → "
              f"{first * scale:.2f} s = {first * scale / BUDGET_S:.2f} × budget "
              f"({'within' if first * scale <= BUDGET_S else 'OVER'} budget)")  # fmt: skip
        connections.close_all()
        if again != 0 or not ok:
            sys.exit(1)
    finally:
        drop_database(config, name)
        print(f"dropped scratch database {name}")


if __name__ == "__main__":
    main()
