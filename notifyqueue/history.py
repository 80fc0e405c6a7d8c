"""The history tables' partitioning, as migration steps.

notification, delivery_attempt, webhook_event and webhook_delivery_attempt are partitioned by
week of creation, read from a UUIDv7 key (the row's own id, or its notification's or event's):
one partition a week (`history_partition_add`, run ahead of time by the worker's upkeep) and a
default partition, `<table>_default`, for any row outside every week's range. Retention drops
whole weeks (delivery/retention.py). See docs/decisions/0021-weekly-history-partitions.md.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime

from django.db import migrations

# The weeks a partition exists for ahead of the current one: the worker's upkeep adds them
# (delivery.upkeep.HistoryPartitions), so a week's partition is there long before its rows.
WEEKS_AHEAD = 2


def uuid7(at: datetime | None = None) -> uuid.UUID:
    """A UUIDv7 stamped with `at`, by default this process's clock: the id of a notification
    the ORM writes (the API's and the worker's statements stamp theirs with the database
    clock, notifyqueue_uuid7), so it lands in the partition of the week it is written in."""
    millis = time.time_ns() // 1_000_000 if at is None else int(at.timestamp() * 1000)
    value = bytearray(millis.to_bytes(6, "big") + os.urandom(10))
    value[6] = 0x70 | (value[6] & 0x0F)
    value[8] = 0x80 | (value[8] & 0x3F)
    return uuid.UUID(bytes=bytes(value))


def history_table_partition(table: str, *, key: str, primary_key: str) -> migrations.RunSQL:
    """A migration step that makes `table` partitioned by range of `key` without moving a row:
    the table as it is becomes the default partition, `<table>_default`, with its indexes
    renamed `d_<name>` and its triggers dropped; the new parent takes the table's name, its
    columns, CHECK constraints, primary key (`primary_key`, which names `key`), foreign keys
    and indexes under their own names, PostgreSQL attaching the default partition's equal ones
    instead of building them. Triggers are loaded on the parent afterwards from their files.
    Reversed, every week's rows move back into the default partition, which becomes the
    table again, with its indexes', constraints' and the parent's triggers' names."""
    default = f"{table}_default"
    return migrations.RunSQL(
        f"""
DO $convert$
DECLARE
    r record;
    indexes text[];
    foreign_keys text[];
BEGIN
    SELECT array_agg(pg_get_indexdef(i.indexrelid)) INTO indexes
      FROM pg_index AS i
     WHERE i.indrelid = '{table}'::regclass
       AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid);
    SELECT array_agg(format('ALTER TABLE {table} ADD CONSTRAINT %I %s', k.conname,
                            pg_get_constraintdef(k.oid)))
      INTO foreign_keys
      FROM pg_constraint AS k
     WHERE k.conrelid = '{table}'::regclass AND k.contype = 'f';
    FOR r IN SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
              WHERE i.indrelid = '{table}'::regclass
                AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid)
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.relname, left('d_' || r.relname, 63));
    END LOOP;
    FOR r IN SELECT k.conname FROM pg_constraint AS k
              WHERE k.conrelid = '{table}'::regclass AND k.contype IN ('p', 'u')
    LOOP
        EXECUTE format('ALTER TABLE {table} RENAME CONSTRAINT %I TO %I', r.conname,
                       left('d_' || r.conname, 63));
    END LOOP;
    FOR r IN SELECT t.tgname FROM pg_trigger AS t
              WHERE t.tgrelid = '{table}'::regclass AND NOT t.tgisinternal
    LOOP
        EXECUTE format('DROP TRIGGER %I ON {table}', r.tgname);
    END LOOP;
    ALTER TABLE {table} RENAME TO {default};
    CREATE TABLE {table} (LIKE {default} INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                          INCLUDING STORAGE INCLUDING COMMENTS)
        PARTITION BY RANGE ({key});
    ALTER TABLE {table} ATTACH PARTITION {default} DEFAULT;
    ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({primary_key});
    FOR i IN 1 .. coalesce(array_length(indexes, 1), 0) LOOP
        EXECUTE indexes[i];
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(foreign_keys, 1), 0) LOOP
        EXECUTE foreign_keys[i];
    END LOOP;
END $convert$;
""",
        reverse_sql=rf"""
DO $revert$
DECLARE
    r record;
    triggers text[];
BEGIN
    SELECT array_agg(pg_get_triggerdef(t.oid)) INTO triggers
      FROM pg_trigger AS t
     WHERE t.tgrelid = '{table}'::regclass AND NOT t.tgisinternal AND t.tgparentid = 0;
    FOR r IN SELECT h.inhrelid::regclass::text AS name FROM pg_inherits AS h
              WHERE h.inhparent = '{table}'::regclass AND h.inhrelid <> '{default}'::regclass
    LOOP
        EXECUTE format('ALTER TABLE {table} DETACH PARTITION %I', r.name);
        EXECUTE format('INSERT INTO {default} SELECT * FROM %I', r.name);
        EXECUTE format('DROP TABLE %I', r.name);
    END LOOP;
    ALTER TABLE {table} DETACH PARTITION {default};
    DROP TABLE {table};
    ALTER TABLE {default} RENAME TO {table};
    FOR r IN SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
              WHERE i.indrelid = '{table}'::regclass AND c.relname LIKE 'd\_%'
                AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid)
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.relname, substring(r.relname FROM 3));
    END LOOP;
    FOR r IN SELECT k.conname FROM pg_constraint AS k
              WHERE k.conrelid = '{table}'::regclass AND k.contype IN ('p', 'u')
                AND k.conname LIKE 'd\_%'
    LOOP
        EXECUTE format('ALTER TABLE {table} RENAME CONSTRAINT %I TO %I', r.conname,
                       substring(r.conname FROM 3));
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(triggers, 1), 0) LOOP
        EXECUTE triggers[i];
    END LOOP;
END $revert$;
""",
    )


def history_partitions_add(table: str, *, key: str, unique: str | None = None) -> migrations.RunSQL:
    """A migration step that adds the partitions of the current week and the WEEKS_AHEAD after
    it (history_partition_add), moving any rows of those weeks out of the default partition."""
    unique_sql = "NULL" if unique is None else f"'{unique}'"
    return migrations.RunSQL(
        f"SELECT history_partition_add('{table}', '{key}', "
        f"notifyqueue_now() + week * interval '7 days', {unique_sql}) "
        f"FROM generate_series(0, {WEEKS_AHEAD}) AS week;",
        reverse_sql=migrations.RunSQL.noop,
    )
