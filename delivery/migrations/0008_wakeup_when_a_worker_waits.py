"""A create sends its wake-up only while a worker waits for one.

Migration 0002's trigger sent `NOTIFY notifyqueue_due` for every insert into notification and
every row put back to PENDING. PostgreSQL queues a notification at commit under one lock for
the whole server, held through the commit's WAL flush, so transactions that notify commit one
at a time: with creates at a high rate and nobody idle to wake (workers busy, or none running),
it capped the commit rate for nothing (docs/performance.md, "Fifth round").

Now a worker marks its heartbeat row `waiting` before it sleeps, and the trigger notifies only
while some row is marked. No wake-up is lost in between:

- the trigger takes a transaction-level advisory lock in shared mode (creates do not wait for
  each other), then reads the marks in a statement of its own, so with the snapshot of that
  moment (READ COMMITTED, the isolation every writer of this project uses);
- a worker marks its row under the same lock in exclusive mode, which waits for every create
  whose trigger already ran to commit or roll back, and then claims once more before sleeping
  (delivery/worker.py): a create whose trigger ran before the mark is committed by then and
  the claim sees it; a create whose trigger runs after it sees the mark and notifies.

A worker that finds its claims full clears its mark, so busy workers cost the creates no
NOTIFY; a worker that stops clears it too, and the live workers' heartbeats clear the mark of
one killed outright (delivery/worker.py, `Worker.heartbeat`).
"""

from django.db import migrations, models

WAKEUP_LOCK = "hashtext('notifyqueue:wakeup')"

WHEN_WAITING = f"""
CREATE OR REPLACE FUNCTION notification_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({WAKEUP_LOCK});
    IF EXISTS (SELECT 1 FROM worker_heartbeat WHERE waiting) THEN
        PERFORM pg_notify('notifyqueue_due', '');
    END IF;
    RETURN NULL;
END $$;
"""

ALWAYS = """
CREATE OR REPLACE FUNCTION notification_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('notifyqueue_due', '');
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("delivery", "0007_outbox_per_statement")]

    operations = [
        migrations.AddField(
            model_name="workerheartbeat",
            name="waiting",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name="workerheartbeat",
            index=models.Index(
                condition=models.Q(("waiting", True)),
                fields=["worker_id"],
                name="worker_waiting",
            ),
        ),
        migrations.RunSQL(WHEN_WAITING, reverse_sql=ALWAYS),
    ]
