"""PostgreSQL guards for the ledger, so a bug or a stray SQL session cannot bend the books.

* transfers and entries are append-only: UPDATE and DELETE raise an integrity error (TRUNCATE, used by test
  database flushes, is a different statement and stays possible);
* every INSERT statement into entries must bring whole transfers that sum to zero (the
  services write all entries of a batch of transfers in one statement).

SQLite (the embedded default) skips these; the services enforce the same rules in code.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION billing_ledger_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing ledger rows are immutable (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_transfer_immutable BEFORE UPDATE OR DELETE ON billing_transfer
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_immutable();
CREATE TRIGGER billing_entry_immutable BEFORE UPDATE OR DELETE ON billing_entry
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_immutable();

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

CREATE TRIGGER billing_entry_balanced AFTER INSERT ON billing_entry
    REFERENCING NEW TABLE AS new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION billing_entries_balanced();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS billing_entry_balanced ON billing_entry;
DROP FUNCTION IF EXISTS billing_entries_balanced();
DROP TRIGGER IF EXISTS billing_entry_immutable ON billing_entry;
DROP TRIGGER IF EXISTS billing_transfer_immutable ON billing_transfer;
DROP FUNCTION IF EXISTS billing_ledger_immutable();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
