"""The ledger tables, tuned for the metering sweep (bench/metering.py), with the same guards.

Every minute the sweep posts a capture per running rental: 100,000 transfers and 300,000
entries, and 100,000 holds and a few thousand accounts updated in place.

* Entries' references to their transfer and account are checked once per INSERT statement,
  by the trigger that already checks each transfer sums to zero, instead of by a foreign-key
  trigger per row (a quarter of the sweep's database time). Transfers were already immutable;
  accounts now cannot be deleted either, so a reference valid at insert stays valid — what the
  foreign keys guaranteed.
* Holds and accounts get free room on each page (fillfactor), so their updates are HOT: the new
  row version goes next to the old one and no index is touched. Applies to pages written from
  now on (``VACUUM FULL`` rewrites existing ones).
* A transfer's idempotency key is unique through a constraint instead of ``unique=True``, which
  also built a LIKE index no query uses; the platform's own entries (no team) leave the
  team-ledger index.
"""

import django.db.models.deletion
from django.db import migrations, models

CHECKED_INSERTS = """
CREATE OR REPLACE FUNCTION billing_entries_balanced() RETURNS trigger AS $$
DECLARE
    bad bigint;
    referenced bigint;
    found_rows bigint;
BEGIN
    SELECT transfer_id INTO bad FROM new_entries
        GROUP BY transfer_id HAVING sum(amount) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'billing transfer % does not sum to zero', bad
            USING ERRCODE = 'check_violation';
    END IF;
    -- Every referenced transfer and account exists: each distinct id looked up once through
    -- the primary key. EXECUTE plans these afresh on every insert; a plan cached while the
    -- tables were small would scan them whole for every batch once they are big.
    SELECT count(DISTINCT transfer_id) INTO referenced FROM new_entries;
    EXECUTE 'SELECT count(*) FROM billing_transfer'
        ' WHERE id = ANY(ARRAY(SELECT DISTINCT transfer_id FROM new_entries))' INTO found_rows;
    IF found_rows <> referenced THEN
        RAISE EXCEPTION 'billing entry for a transfer that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT count(DISTINCT account_id) INTO referenced FROM new_entries;
    EXECUTE 'SELECT count(*) FROM billing_account'
        ' WHERE id = ANY(ARRAY(SELECT DISTINCT account_id FROM new_entries))' INTO found_rows;
    IF found_rows <> referenced THEN
        RAISE EXCEPTION 'billing entry for an account that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION billing_transfers_referenced() RETURNS trigger AS $$
DECLARE
    referenced bigint;
    found_rows bigint;
BEGIN
    SELECT count(DISTINCT hold_id) INTO referenced FROM new_transfers;
    EXECUTE 'SELECT count(*) FROM billing_hold'
        ' WHERE id = ANY(ARRAY(SELECT DISTINCT hold_id FROM new_transfers))' INTO found_rows;
    IF found_rows <> referenced THEN
        RAISE EXCEPTION 'billing transfer for a hold that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT count(DISTINCT team_id) INTO referenced FROM new_transfers;
    EXECUTE 'SELECT count(*) FROM marketplace_team'
        ' WHERE id = ANY(ARRAY(SELECT DISTINCT team_id FROM new_transfers))' INTO found_rows;
    IF found_rows <> referenced THEN
        RAISE EXCEPTION 'billing transfer for a team that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_transfer_referenced AFTER INSERT ON billing_transfer
    REFERENCING NEW TABLE AS new_transfers
    FOR EACH STATEMENT EXECUTE FUNCTION billing_transfers_referenced();

-- What entries and transfers refer to is never deleted. (Teams are kept by their accounts'
-- foreign key: every transfer has an entry on an account of its team.)
CREATE TRIGGER billing_account_kept BEFORE DELETE ON billing_account
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_immutable();
CREATE TRIGGER billing_hold_kept BEFORE DELETE ON billing_hold
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_immutable();

ALTER TABLE billing_hold SET (fillfactor = 50);
ALTER TABLE billing_account SET (fillfactor = 50);
"""

ONLY_BALANCED_INSERTS = """
ALTER TABLE billing_account RESET (fillfactor);
ALTER TABLE billing_hold RESET (fillfactor);

DROP TRIGGER IF EXISTS billing_hold_kept ON billing_hold;
DROP TRIGGER IF EXISTS billing_account_kept ON billing_account;
DROP TRIGGER IF EXISTS billing_transfer_referenced ON billing_transfer;
DROP FUNCTION IF EXISTS billing_transfers_referenced();

CREATE OR REPLACE FUNCTION billing_entries_balanced() RETURNS trigger AS $$
DECLARE
    unbalanced bigint;
BEGIN
    SELECT transfer_id INTO unbalanced FROM new_entries
        GROUP BY transfer_id HAVING sum(amount) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'billing transfer % does not sum to zero', unbalanced
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CHECKED_INSERTS, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ONLY_BALANCED_INSERTS, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0004_capture_both_usage_kinds"),
        ("marketplace", "0001_initial"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="entry", name="billing_entry_team_created"),
        migrations.AlterField(
            model_name="entry",
            name="account",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="entries",
                to="billing.account",
            ),
        ),
        migrations.AlterField(
            model_name="entry",
            name="transfer",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="entries",
                to="billing.transfer",
            ),
        ),
        migrations.AlterField(
            model_name="transfer",
            name="hold",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="transfers",
                to="billing.hold",
            ),
        ),
        migrations.AlterField(
            model_name="transfer",
            name="team",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                help_text="The team the transfer is for (the renter for holds and charges).",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="marketplace.team",
            ),
        ),
        migrations.AlterField(
            model_name="transfer",
            name="idempotency_key",
            field=models.CharField(max_length=200),
        ),
        migrations.AddIndex(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("team__isnull", False)),
                fields=["team", "created_at"],
                name="billing_entry_team_created",
            ),
        ),
        migrations.AddConstraint(
            model_name="transfer",
            constraint=models.UniqueConstraint(
                fields=("idempotency_key",), name="billing_transfer_unique_key"
            ),
        ),
        migrations.RunPython(forward, backward),
    ]
