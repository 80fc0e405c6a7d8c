"""Room on each page for the finish's update of an attempt row, so it is a HOT update.

Every claim inserts a batch of attempt rows and the finish updates each of them once
(finished_at, outcome, error, provider message id: no indexed column). With full pages each new
version goes to another page and every index of the table gets a new entry. A page half empty
holds the new version of each row written into it, so the update touches no index; the cost is
a table twice the size (pruned with the notifications, see prune_notifications). Only pages
written from now on keep the room.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("delivery", "0005_attempt_notification_index_once")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE delivery_attempt SET (fillfactor = 50)",
            reverse_sql="ALTER TABLE delivery_attempt RESET (fillfactor)",
        )
    ]
