"""A user's inbox pages come off an index in order, unread ones too.

The page's order is (created_at, id) newest first, by keyset. `inbox_by_user` ended at
`created_at` (an incremental sort for ties) and `inbox_unread` held no order at all, so a page
of unread messages read and sorted every unread message of the user: the more a user left
unread, the more each page cost. Both indexes now end with (created_at DESC, id DESC).
"""

from django.db import migrations, models

PAGE_ORDER = ["client", "user_id", "-created_at", "-id"]


class Migration(migrations.Migration):
    dependencies = [
        ("clients", "0005_request_window_unlogged"),
        ("delivery", "0010_finish_function"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="inboxmessage", name="inbox_by_user"),
        migrations.RemoveIndex(model_name="inboxmessage", name="inbox_unread"),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(fields=PAGE_ORDER, name="inbox_by_user"),
        ),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(
                fields=PAGE_ORDER, name="inbox_unread", condition=models.Q(read_at__isnull=True)
            ),
        ),
    ]
