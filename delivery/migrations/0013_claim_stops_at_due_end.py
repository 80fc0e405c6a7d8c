"""The claim's walk of a (priority, client) pair's due rows ends at the end of its due range:
the range is also written as equalities and a bound on due_at, so a client whose rows are all
held for later costs the other clients' claims a probe, not a walk of its rows."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0012_bounded_rate_deferral"),
    ]

    operations = [
        database_objects_reload("delivery/sql/functions/notification_claim_due_many.sql"),
    ]
