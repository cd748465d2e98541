"""What each web process's offer index (``marketplace.offer_index``) reads to stay current:
which machines' offers changed, by which transaction, and an epoch that a TRUNCATE resets.

Triggers write them, so every writer of offers is seen (the refresh, a machine's deletion
cascading, raw SQL, a bench's seeding), not only the ones that remember to. PostgreSQL only:
the embedded SQLite database has no index (search runs as SQL there)."""

from django.db import migrations

FORWARD = """
CREATE TABLE marketplace_offer_change (
    machine_id bigint PRIMARY KEY,
    xid xid8 NOT NULL
);

CREATE INDEX marketplace_offer_change_xid ON marketplace_offer_change (xid);

CREATE TABLE marketplace_offer_index_epoch (
    id integer PRIMARY KEY CHECK (id = 1),
    token uuid NOT NULL
);

CREATE FUNCTION marketplace_offer_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO marketplace_offer_change (machine_id, xid)
        SELECT DISTINCT machine_id, pg_current_xact_id() FROM new_rows ORDER BY machine_id
        ON CONFLICT (machine_id) DO UPDATE SET xid = EXCLUDED.xid;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO marketplace_offer_change (machine_id, xid)
        SELECT DISTINCT machine_id, pg_current_xact_id() FROM old_rows ORDER BY machine_id
        ON CONFLICT (machine_id) DO UPDATE SET xid = EXCLUDED.xid;
    ELSE
        INSERT INTO marketplace_offer_change (machine_id, xid)
        SELECT machine_id, pg_current_xact_id()
        FROM (SELECT machine_id FROM new_rows UNION SELECT machine_id FROM old_rows) AS changed
        ORDER BY machine_id
        ON CONFLICT (machine_id) DO UPDATE SET xid = EXCLUDED.xid;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION marketplace_offer_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM marketplace_offer_index_epoch;
    DELETE FROM marketplace_offer_change;
    RETURN NULL;
END
$$;

CREATE TRIGGER marketplace_offer_inserted AFTER INSERT ON marketplace_offer
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marketplace_offer_changed();

CREATE TRIGGER marketplace_offer_updated AFTER UPDATE ON marketplace_offer
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marketplace_offer_changed();

CREATE TRIGGER marketplace_offer_deleted AFTER DELETE ON marketplace_offer
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marketplace_offer_changed();

CREATE TRIGGER marketplace_offer_truncated AFTER TRUNCATE ON marketplace_offer
    FOR EACH STATEMENT EXECUTE FUNCTION marketplace_offer_truncated();
"""

BACKWARD = """
DROP TRIGGER marketplace_offer_truncated ON marketplace_offer;
DROP TRIGGER marketplace_offer_deleted ON marketplace_offer;
DROP TRIGGER marketplace_offer_updated ON marketplace_offer;
DROP TRIGGER marketplace_offer_inserted ON marketplace_offer;
DROP FUNCTION marketplace_offer_truncated();
DROP FUNCTION marketplace_offer_changed();
DROP TABLE marketplace_offer_index_epoch;
DROP TABLE marketplace_offer_change;
"""


def _run(schema_editor, script: str) -> None:
    """Each statement of ``script`` (statements are separated by a blank line)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in script.strip().split("\n\n"):
        schema_editor.execute(statement, params=None)


def forward(apps, schema_editor):
    _run(schema_editor, FORWARD)


def backward(apps, schema_editor):
    _run(schema_editor, BACKWARD.replace(";\n", ";\n\n"))


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0025_volume_cloned_from"),
    ]

    operations = [migrations.RunPython(forward, backward)]
