"""CRITICAL becomes a per-client permission, off for new clients. Clients that exist when
this runs keep what they could do before (every client could send CRITICAL)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("clients", "0003_client_request_window")]

    operations = [
        migrations.AddField(
            model_name="client",
            name="may_send_critical",
            field=models.BooleanField(
                default=False,
                help_text="May create CRITICAL notifications, which go before every other "
                "client's and are never rate-limited. Off for new clients.",
            ),
        ),
        migrations.RunSQL(
            "UPDATE clients_client SET may_send_critical = true",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
