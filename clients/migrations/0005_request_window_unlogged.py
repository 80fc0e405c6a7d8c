"""The throttle's counters live in an UNLOGGED table: its writes make no WAL, so the commit of
a request's count does not wait for a WAL flush, and one client's requests do not queue
behind each other's fsyncs on its counter row. After a crash the table is empty: every
client's count starts again, which a throttle can afford."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("clients", "0004_client_may_send_critical")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE clients_request_window SET UNLOGGED",
            reverse_sql="ALTER TABLE clients_request_window SET LOGGED",
        ),
    ]
