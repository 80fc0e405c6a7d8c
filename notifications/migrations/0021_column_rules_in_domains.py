"""The notification table's one-column rules move from table CHECKs into domains.

PostgreSQL re-reads a table's CHECK constraints from their stored text for every statement
that writes the table, and prepares each again (parsing the node text, constant folding,
expression set-up): for the eight CHECKs of `notification`, 322,000 of the 1,198,000
instructions PostgreSQL spent on a create (callgrind, docs/performance.md, "Nineteenth
round"), and the same again for each claim, finish or retry statement however many rows it
writes. A domain's constraints are read once per server connection (the type cache) and only
set up per statement.

So the six rules that name one column are each a domain's CHECK, under the same names:
`notification_status` (the seven statuses), `notification_channel` (the four channels),
`notification_priority` (0 to 3) and `notification_count` (not negative; attempt_count,
max_attempts, operator_retries). The two rules between columns stay on the table
(`notification_claim_iff_processing`, `notification_attempts_bounded`).

Without rewriting the table or its indexes: each column first becomes a domain without a rule
over its own type (a change of type PostgreSQL makes in the catalog only), then each domain
gets its rule `NOT VALID` (no scan: every row already met it under the table CHECK dropped in
the same transaction), and the table CHECKs go. A domain's rule marked NOT VALID is checked on
every value written from then on, as a validated one is. `notification_wakeup_pending` names
`status` in its WHEN clause and is made again around the change of type.

A PL/pgSQL function's `RETURN QUERY` must answer exactly the types it declares: the finish
(`notification_finish_many`, migration delivery 0010) answers the row's status and channel as
`varchar`, so it now casts them from their domains.
"""

import importlib

from django.db import migrations

import notifications.models

# The finish as migration delivery 0010 made it; its statement answers status and channel.
FINISH = importlib.import_module("delivery.migrations.0010_finish_function").FUNCTION
FINISH_ANSWER = "SELECT f.id, f.status, f.channel, f.client_id, f.recipient,"
assert FINISH.count(FINISH_ANSWER) == 1
FINISH_BEFORE = FINISH.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
FINISH_AFTER = FINISH_BEFORE.replace(
    FINISH_ANSWER, "SELECT f.id, f.status::varchar, f.channel::varchar, f.client_id, f.recipient,"
)

COUNTS = ("attempt_count", "max_attempts", "operator_retries")

# As migration delivery 0002 made it; it names `status`, so it is made again around the change.
WAKEUP_PENDING = """
CREATE TRIGGER notification_wakeup_pending
AFTER UPDATE OF status ON notification
FOR EACH ROW
WHEN (NEW.status = 'PENDING' AND OLD.status <> 'PENDING')
EXECUTE FUNCTION notification_wakeup();
"""

FORWARD = f"""
CREATE DOMAIN notification_status AS varchar(16);
CREATE DOMAIN notification_channel AS varchar(16);
CREATE DOMAIN notification_priority AS smallint;
CREATE DOMAIN notification_count AS integer;

DROP TRIGGER notification_wakeup_pending ON notification;
ALTER TABLE notification
    ALTER COLUMN status TYPE notification_status,
    ALTER COLUMN channel TYPE notification_channel,
    ALTER COLUMN priority TYPE notification_priority,
    {", ".join(f"ALTER COLUMN {column} TYPE notification_count" for column in COUNTS)};
{WAKEUP_PENDING}

ALTER DOMAIN notification_status ADD CONSTRAINT notification_status_valid
    CHECK (VALUE IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED', 'CANCELLED',
                     'SUPPRESSED')) NOT VALID;
ALTER DOMAIN notification_channel ADD CONSTRAINT notification_channel_valid
    CHECK (VALUE IN ('email', 'sms', 'push', 'in_app')) NOT VALID;
ALTER DOMAIN notification_priority ADD CONSTRAINT notification_priority_valid
    CHECK (VALUE BETWEEN 0 AND 3) NOT VALID;
ALTER DOMAIN notification_count ADD CONSTRAINT notification_count_not_negative
    CHECK (VALUE >= 0) NOT VALID;

ALTER TABLE notification
    DROP CONSTRAINT notification_status_valid,
    DROP CONSTRAINT notification_channel_valid,
    DROP CONSTRAINT notification_priority_valid,
    {", ".join(f"DROP CONSTRAINT notification_{column}_check" for column in COUNTS)};

{FINISH_AFTER}
"""

BACKWARD = f"""
{FINISH_BEFORE}

DROP TRIGGER notification_wakeup_pending ON notification;
ALTER TABLE notification
    ALTER COLUMN status TYPE varchar(16),
    ALTER COLUMN channel TYPE varchar(16),
    ALTER COLUMN priority TYPE smallint,
    {", ".join(f"ALTER COLUMN {column} TYPE integer" for column in COUNTS)};
{WAKEUP_PENDING}
DROP DOMAIN notification_status;
DROP DOMAIN notification_channel;
DROP DOMAIN notification_priority;
DROP DOMAIN notification_count;

ALTER TABLE notification
    ADD CONSTRAINT notification_status_valid
        CHECK (status IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED',
                          'CANCELLED', 'SUPPRESSED')),
    ADD CONSTRAINT notification_channel_valid
        CHECK (channel IN ('email', 'sms', 'push', 'in_app')),
    ADD CONSTRAINT notification_priority_valid CHECK (priority >= 0 AND priority <= 3),
    {", ".join(f"ADD CONSTRAINT notification_{c}_check CHECK ({c} >= 0)" for c in COUNTS)};
"""


def _count(**kwargs):
    return notifications.models.DomainPositiveIntegerField(domain="notification_count", **kwargs)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0020_pending_count_by_index"),
        ("delivery", "0002_notification_triggers"),  # notification_wakeup_pending
        ("delivery", "0010_finish_function"),  # notification_finish_many
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.RemoveConstraint("notification", "notification_status_valid"),
                migrations.RemoveConstraint("notification", "notification_channel_valid"),
                migrations.RemoveConstraint("notification", "notification_priority_valid"),
                migrations.AlterField(
                    "notification",
                    "status",
                    notifications.models.DomainCharField(
                        choices=[
                            ("PENDING", "Pending"),
                            ("PROCESSING", "Processing"),
                            ("SENT", "Sent"),
                            ("FAILED", "Failed"),
                            ("DEAD_LETTERED", "Dead Lettered"),
                            ("CANCELLED", "Cancelled"),
                            ("SUPPRESSED", "Suppressed"),
                        ],
                        default="PENDING",
                        domain="notification_status",
                        max_length=16,
                    ),
                ),
                migrations.AlterField(
                    "notification",
                    "channel",
                    notifications.models.DomainCharField(
                        choices=[
                            ("email", "Email"),
                            ("sms", "Sms"),
                            ("push", "Push"),
                            ("in_app", "In App"),
                        ],
                        domain="notification_channel",
                        max_length=16,
                    ),
                ),
                migrations.AlterField(
                    "notification",
                    "priority",
                    notifications.models.DomainSmallIntegerField(
                        choices=[(0, "Critical"), (1, "High"), (2, "Normal"), (3, "Low")],
                        default=2,
                        domain="notification_priority",
                    ),
                ),
                migrations.AlterField("notification", "attempt_count", _count(default=0)),
                migrations.AlterField("notification", "max_attempts", _count()),
                migrations.AlterField("notification", "operator_retries", _count(default=0)),
            ],
        ),
    ]
