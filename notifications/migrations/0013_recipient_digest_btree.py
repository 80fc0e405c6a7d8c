"""The recipient indexes become btrees keyed by the recipient's digest (`md5(recipient)::uuid`).

A hash index keeps all the entries of one key in one bucket, and an insert walks that bucket's
pages from the first to one with room: each create for a recipient cost more the more rows the
recipient already had (1,000 inserts of one recipient: 0.75 ms with 1,000 rows before them,
67 ms with 300,000; a btree: 1.1 ms and 0.8 ms). A btree cannot hold the recipient itself (a
push token may be longer than a btree entry allows), so its key is the 16-byte digest, and each
look-up also compares the recipient. The list's index carries the client and the list's order,
so a client's page filtered by recipient is read off the index in order.
"""

from django.db import migrations, models
from django.db.models.functions import MD5, Cast

DIGEST = Cast(MD5(models.F("recipient")), output_field=models.UUIDField())


class Migration(migrations.Migration):
    dependencies = [
        ("clients", "0005_request_window_unlogged"),
        ("notifications", "0012_create_checked_function"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="notification", name="notification_recipient"),
        migrations.RemoveIndex(model_name="notification", name="notification_rate_held"),
        migrations.AddIndex(
            model_name="notification",
            index=models.Index(
                DIGEST,
                models.F("client"),
                models.F("created_at").desc(),
                models.F("id").desc(),
                name="notification_recipient",
            ),
        ),
        migrations.AddIndex(
            model_name="notification",
            index=models.Index(
                DIGEST,
                condition=models.Q(rate_deferred_from__isnull=False),
                name="notification_rate_held",
            ),
        ),
    ]
