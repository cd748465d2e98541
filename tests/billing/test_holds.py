"""Holds, captures, releases and the ledger rules, on PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from billing import metering
from billing.credits import credit_grant, payout_record
from billing.errors import (
    HoldCaptured,
    HoldClosed,
    IdempotencyConflict,
    InsufficientCredit,
    InsufficientEarnings,
    InvalidAmount,
)
from billing.holds import hold_capture_usage, hold_create, hold_extend, hold_release, hold_void
from billing.metering import HoldUsage, holds_settle_usage
from billing.models import Account, AccountKind, Entry, Hold, HoldStatus, Transfer, TransferKind
from billing.selectors import team_balance, team_earnings_balance, team_low_balance
from tests.billing.databases import LEDGER_TRIGGERS
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts

pytestmark = pytest.mark.django_db

USD = 1_000_000


def grant(team, amount, key="g1"):
    return credit_grant(team_id=team.id, amount=amount, reason="test", idempotency_key=key)


def make_hold(renter, provider, amount, key="h1", reference="rental:1", **extra):
    return hold_create(
        team_id=renter.id,
        provider_team_id=provider.id,
        amount=amount,
        reference=reference,
        idempotency_key=key,
        **extra,
    )


def revenue() -> int:
    account = Account.objects.filter(kind=AccountKind.PLATFORM_REVENUE).first()
    return account.balance if account else 0


def test_credit_grant_is_balanced_and_idempotent(renter_team):
    first = grant(renter_team, 50 * USD)
    again = grant(renter_team, 50 * USD)
    assert again.pk == first.pk
    assert team_balance(renter_team.id) == (50 * USD, 0)
    assert sorted(first.entries.values_list("amount", flat=True)) == [-50 * USD, 50 * USD]
    assert_ledger_consistent()


def test_credit_grant_reusing_a_key_for_another_amount_is_a_conflict(renter_team):
    grant(renter_team, 50 * USD)
    before = ledger_counts()
    with pytest.raises(IdempotencyConflict):
        grant(renter_team, 60 * USD)
    assert ledger_counts() == before


@pytest.mark.parametrize("amount", [0, -5, 1.5, True, "10"])
def test_invalid_amounts_are_refused_before_any_write(renter_team, amount):
    before = ledger_counts()
    with pytest.raises(InvalidAmount):
        grant(renter_team, amount)
    assert ledger_counts() == before


def test_hold_moves_available_to_held(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD, machine_reference="machine:7")
    assert hold.status == HoldStatus.OPEN and hold.remaining == 4 * USD
    assert team_balance(renter_team.id) == (6 * USD, 4 * USD)
    assert make_hold(renter_team, provider_team, 4 * USD).pk == hold.pk  # idempotent
    assert team_balance(renter_team.id) == (6 * USD, 4 * USD)
    assert_ledger_consistent()


def test_hold_with_too_little_credit_raises_and_writes_nothing(renter_team, provider_team):
    grant(renter_team, 3 * USD)
    before = ledger_counts()
    with pytest.raises(InsufficientCredit) as caught:
        make_hold(renter_team, provider_team, 3 * USD + 1)
    assert caught.value.http_status == 402
    assert caught.value.error_code == "insufficient_credit"
    assert "$3.000001" in str(caught.value)
    assert ledger_counts() == before


def test_hold_key_reused_for_another_rental_is_a_conflict(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    make_hold(renter_team, provider_team, USD)
    with pytest.raises(IdempotencyConflict):
        make_hold(renter_team, provider_team, USD, reference="rental:2")


def test_capture_usage_captures_only_the_difference(renter_team, provider_team, settings):
    settings.PLATFORM_FEE_PERCENT = "10"
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 5 * USD)
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=USD) == USD
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=USD) == 0
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=1_500_000) == 500_000
    assert hold_capture_usage(hold_id=hold.pk, kind="storage", owed_total=200_000) == 200_000
    hold.refresh_from_db()
    assert (hold.captured_gpu, hold.captured_storage) == (1_500_000, 200_000)
    assert team_balance(renter_team.id) == (5 * USD, 5 * USD - 1_700_000)
    assert revenue() == 170_000
    assert team_earnings_balance(provider_team.id) == 1_530_000
    capture = Transfer.objects.filter(kind=TransferKind.CAPTURE).order_by("pk").first()
    assert (capture.amount, capture.fee, capture.usage_kind) == (USD, 100_000, "gpu")
    assert_ledger_consistent()


def test_platform_fee_rounding_does_not_accumulate(renter_team, provider_team, settings):
    settings.PLATFORM_FEE_PERCENT = "12.5"
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 5 * USD)
    for owed in range(3, 3 * 400, 3):  # 399 captures of 3 micro-dollars
        hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=owed)
    hold.refresh_from_db()
    assert revenue() == round(hold.captured * 0.125)
    assert_ledger_consistent()


def test_capture_is_capped_at_what_the_hold_holds(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 2 * USD)
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=3 * USD) == 2 * USD
    assert hold_capture_usage(hold_id=hold.pk, kind="storage", owed_total=USD) == 0
    # An extension lets the rest of what is owed through.
    hold_extend(hold_id=hold.pk, amount=2 * USD, idempotency_key="ext-1")
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=3 * USD) == USD
    assert_ledger_consistent()


def test_extend_is_idempotent_and_refuses_when_short(renter_team, provider_team):
    grant(renter_team, 5 * USD)
    hold = make_hold(renter_team, provider_team, 2 * USD)
    hold_extend(hold_id=hold.pk, amount=USD, idempotency_key="ext-1")
    hold_extend(hold_id=hold.pk, amount=USD, idempotency_key="ext-1")
    hold.refresh_from_db()
    assert hold.amount == 3 * USD
    assert team_balance(renter_team.id) == (2 * USD, 3 * USD)
    before = ledger_counts()
    with pytest.raises(InsufficientCredit):
        hold_extend(hold_id=hold.pk, amount=3 * USD, idempotency_key="ext-2")
    assert ledger_counts() == before
    hold.refresh_from_db()
    assert hold.amount == 3 * USD


def test_release_returns_the_rest_once(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=USD)
    assert hold_release(hold_id=hold.pk) == 3 * USD
    before = ledger_counts()
    assert hold_release(hold_id=hold.pk) == 0
    assert hold_void(hold_id=hold.pk) == 0
    assert ledger_counts() == before
    hold.refresh_from_db()
    assert (hold.status, hold.released, hold.remaining) == (HoldStatus.RELEASED, 3 * USD, 0)
    assert team_balance(renter_team.id) == (9 * USD, 0)
    assert_ledger_consistent()


def test_closed_hold_takes_no_new_captures_or_extensions(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=USD)
    hold_release(hold_id=hold.pk)
    before = ledger_counts()
    # A retried final capture with nothing new is harmless.
    assert hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=USD) == 0
    with pytest.raises(HoldClosed) as caught:
        hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=2 * USD)
    assert caught.value.http_status == 409
    with pytest.raises(HoldClosed):
        hold_extend(hold_id=hold.pk, amount=USD, idempotency_key="late")
    assert ledger_counts() == before


def test_void_returns_everything_of_an_uncaptured_hold(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    assert hold_void(hold_id=hold.pk) == 4 * USD
    assert hold_void(hold_id=hold.pk) == 0
    assert hold_release(hold_id=hold.pk) == 0
    assert team_balance(renter_team.id) == (10 * USD, 0)
    hold.refresh_from_db()
    assert hold.status == HoldStatus.VOIDED
    assert_ledger_consistent()


def test_void_of_a_captured_hold_is_refused(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    hold_capture_usage(hold_id=hold.pk, kind="storage", owed_total=1)
    before = ledger_counts()
    with pytest.raises(HoldCaptured):
        hold_void(hold_id=hold.pk)
    assert ledger_counts() == before


def test_capture_rejects_unknown_kind_and_negative_totals(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    with pytest.raises(InvalidAmount):
        hold_capture_usage(hold_id=hold.pk, kind="bandwidth", owed_total=1)
    with pytest.raises(InvalidAmount):
        hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=-1)
    before = ledger_counts()
    with pytest.raises(InvalidAmount, match="gpu"):
        holds_settle_usage([HoldUsage(hold.pk, gpu=-5, storage=0)])
    with pytest.raises(InvalidAmount, match="storage"):
        holds_settle_usage([HoldUsage(hold.pk, gpu=5, storage=1.5)])
    assert ledger_counts() == before


def test_settle_usage_batch_matches_single_captures(renter_team, provider_team, monkeypatch):
    monkeypatch.setattr(metering, "SETTLE_BATCH_SIZE", 3)  # several batches
    grant(renter_team, 100 * USD)
    holds = [
        make_hold(renter_team, provider_team, 5 * USD, key=f"h{i}", reference=f"rental:{i}")
        for i in range(7)
    ]
    hold_release(hold_id=holds[6].pk)
    items = [HoldUsage(h.pk, gpu=1_000_000 + i, storage=0) for i, h in enumerate(holds)]
    items += [HoldUsage(holds[0].pk, gpu=0, storage=10), HoldUsage(holds[1].pk, 6 * USD, 0)]
    items += [HoldUsage(999_999_999, gpu=USD, storage=0)]  # unknown hold: skipped
    captured = holds_settle_usage(items)
    # hold 1 is capped at its 5 USD (the larger of its two totals wins); hold 6 is closed;
    # hold 0 is listed twice: its larger GPU total and its storage make one capture.
    assert captured == sum(1_000_000 + i for i in (0, 2, 3, 4, 5)) + 10 + 5 * USD
    assert holds_settle_usage(items) == 0  # a repeated sweep captures nothing
    assert_ledger_consistent()


def test_low_balance_selector(renter_team, provider_team):
    assert team_low_balance(renter_team.id, 1)
    grant(renter_team, 10 * USD)
    assert not team_low_balance(renter_team.id, 10 * USD)
    make_hold(renter_team, provider_team, 4 * USD)
    assert team_low_balance(renter_team.id, 7 * USD)


def test_payout_moves_earnings_out_and_never_more(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=2 * USD)
    earned = team_earnings_balance(provider_team.id)
    before = ledger_counts()
    with pytest.raises(InsufficientEarnings):
        payout_record(
            provider_team_id=provider_team.id, amount=earned + 1, idempotency_key="p1", note="x"
        )
    assert ledger_counts() == before
    payout_record(
        provider_team_id=provider_team.id, amount=earned, idempotency_key="p1", note="bank"
    )
    payout_record(
        provider_team_id=provider_team.id, amount=earned, idempotency_key="p1", note="bank"
    )
    assert team_earnings_balance(provider_team.id) == 0
    assert_ledger_consistent()


def test_balance_changed_sent_on_commit(renter_team, django_capture_on_commit_callbacks):
    from billing.signals import balance_changed

    seen = []

    def receiver(sender, team_ids, **kwargs):
        seen.extend(team_ids)

    balance_changed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            grant(renter_team, 10 * USD)
            assert seen == []
        assert seen == [renter_team.id]
    finally:
        balance_changed.disconnect(receiver)


# --- the database refuses what the code must never do ----------------------------------------


def test_database_refuses_available_below_zero(renter_team):
    grant(renter_team, USD)
    with pytest.raises(IntegrityError), transaction.atomic():
        Account.objects.filter(team=renter_team, kind=AccountKind.AVAILABLE).update(balance=-1)


def test_database_refuses_over_resolving_a_hold(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    with pytest.raises(IntegrityError), transaction.atomic():
        Hold.objects.filter(pk=hold.pk).update(captured_gpu=3 * USD, captured_storage=2 * USD)


@LEDGER_TRIGGERS
def test_ledger_rows_are_immutable(renter_team):
    transfer = grant(renter_team, USD)
    with pytest.raises(TypeError):
        Transfer.objects.filter(pk=transfer.pk).update(amount=5)
    with pytest.raises(TypeError):
        transfer.entries.first().delete()
    with pytest.raises(TypeError):
        transfer.save()
    # Even raw SQL cannot edit or delete them on PostgreSQL.
    for sql in (
        "UPDATE billing_entry SET amount = amount * 2",
        "DELETE FROM billing_transfer",
    ):
        with (
            pytest.raises(IntegrityError, match="immutable"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql)


@LEDGER_TRIGGERS
def test_database_refuses_an_unbalanced_insert(renter_team):
    transfer = grant(renter_team, USD)
    account = Account.objects.get(team=renter_team, kind=AccountKind.AVAILABLE)
    with pytest.raises(IntegrityError, match="does not sum to zero"), transaction.atomic():
        Entry.objects.create(
            transfer=transfer,
            account=account,
            team=renter_team,
            account_kind=account.kind,
            amount=1,
            balance_after=0,
            created_at=transfer.created_at,
        )


def _balanced_entries(transfer_id: int, account_ids: tuple[int, int], team_id: int) -> list:
    return [
        Entry(transfer_id=transfer_id, account_id=account_id, team_id=team_id,
              account_kind="available", amount=amount, balance_after=0, created_at=timezone.now())
        for account_id, amount in zip(account_ids, (1, -1), strict=True)
    ]  # fmt: skip


@LEDGER_TRIGGERS
def test_database_refuses_entries_for_missing_transfers_or_accounts(renter_team):
    transfer = grant(renter_team, USD)
    available = Account.objects.get(team=renter_team, kind=AccountKind.AVAILABLE)
    grants = Account.objects.get(kind=AccountKind.GRANTS)
    before = ledger_counts()
    for entries, message in (
        (_balanced_entries(999_999_999, (available.pk, grants.pk), renter_team.pk), "transfer"),
        (_balanced_entries(transfer.pk, (available.pk, 999_999_999), renter_team.pk), "account"),
    ):
        with (
            pytest.raises(IntegrityError, match=f"entry for an? {message} that does not exist"),
            transaction.atomic(),
        ):
            Entry.objects.bulk_create(entries)
    assert ledger_counts() == before


@LEDGER_TRIGGERS
def test_database_refuses_transfers_for_missing_holds_or_teams(renter_team):
    before = ledger_counts()
    for fields, message in (({"hold_id": 999_999_999}, "hold"), ({"team_id": 999_999_999}, "team")):
        transfer = Transfer(kind="capture", idempotency_key=f"bad-{message}", amount=1, **fields)
        with (
            pytest.raises(IntegrityError, match=f"transfer for a {message} that does not exist"),
            transaction.atomic(),
        ):
            Transfer.objects.bulk_create([transfer])
    assert ledger_counts() == before


@LEDGER_TRIGGERS
def test_database_refuses_deleting_accounts_and_holds(renter_team, provider_team):
    grant(renter_team, 10 * USD)
    hold = make_hold(renter_team, provider_team, 4 * USD)
    for table in ("billing_account", "billing_hold"):
        with (
            pytest.raises(IntegrityError, match="immutable"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(f"DELETE FROM {table}")  # noqa: S608 (a constant)
    assert Hold.objects.filter(pk=hold.pk).exists()
