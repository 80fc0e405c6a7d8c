"""Cancelled rows are no longer held by a rate-limit deferral.

A cancel left `rate_deferred_from` set on a row a deferral had held back, so the row stayed in
`notification_rate_held` until retention deleted it: every admission of that recipient then
found a "held" row, counted the key's window and looked through those rows for one to release
(`ratelimit_release_next`), all of them cancelled. The cancel now clears it
(notifications/sql/notifications.sql); this clears it on the rows cancelled before, which the
partial index finds.
"""

from django.db import migrations

CLEAR = """
UPDATE notification SET rate_deferred_from = NULL
WHERE rate_deferred_from IS NOT NULL AND status = 'CANCELLED';
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0014_queue_recipient_digest")]

    operations = [migrations.RunSQL(CLEAR, reverse_sql=migrations.RunSQL.noop)]
