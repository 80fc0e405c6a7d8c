"""Half of each page of the record left free, so that a claim and a finish, which update
every row they touch, find room for the new version on the same page (HOT) almost always.

At 70 a 100-row claim filled its pages and 37 % of the record's updates were not HOT; each of
those writes an entry into all six of the record's indexes, which past shared_buffers (a
table of millions) are reads from disk. At 50: 94 % HOT, and a drain with 1,000,000 finished
rows in the table ran at the empty table's rate (docs/performance.md). The cost is space:
a delivered row keeps its page half empty, about twice the heap of a full page.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("notifications", "0009_queue_table")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE notification SET (fillfactor = 50);",
            reverse_sql="ALTER TABLE notification SET (fillfactor = 70);",
        )
    ]
