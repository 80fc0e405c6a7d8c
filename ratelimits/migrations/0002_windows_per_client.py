"""A window per (client, recipient) on every channel, the recipient in its counting form, and the
optional ceiling's key per address. The windows in use are re-keyed from their notifications, so
what was sent in the last window still counts; a held notification keeps its due time and is
checked against its new key when it is claimed."""

from django.db import migrations, models

from notifyqueue.addresses import recipient_key
from notifyqueue.sqlfile import database_objects_reload


def windows_rekey(apps, schema_editor):
    """Each delivery in the window gets its notification's new key. Rows whose notification is
    gone (deleted with its client) are dropped: nothing can be checked against them."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM ratelimit_delivery AS d"
            " WHERE NOT EXISTS (SELECT 1 FROM notification AS n WHERE n.id = d.notification_id)"
        )
        cursor.execute(
            "SELECT d.claim_token, n.channel, n.client_id, n.recipient"
            " FROM ratelimit_delivery AS d JOIN notification AS n ON n.id = d.notification_id"
        )
        rows = cursor.fetchall()
        if not rows:
            return
        cursor.execute(
            "UPDATE ratelimit_delivery AS d"
            " SET key = ratelimit_key(r.channel, r.client_id, r.recipient_key)"
            " FROM unnest(%s::uuid[], %s::text[], %s::uuid[], %s::text[])"
            "      AS r(claim_token, channel, client_id, recipient_key)"
            " WHERE d.claim_token = r.claim_token",
            [
                [claim_token for claim_token, _, _, _ in rows],
                [channel for _, channel, _, _ in rows],
                [client_id for _, _, client_id, _ in rows],
                [recipient_key(channel, recipient) for _, channel, _, recipient in rows],
            ],
        )


class Migration(migrations.Migration):
    dependencies = [
        ("ratelimits", "0001_initial"),
        ("notifications", "0003_ratelimit_release_freed"),
    ]

    operations = [
        migrations.AddField(
            model_name="recipientdelivery",
            name="address_key",
            field=models.BinaryField(null=True),
        ),
        migrations.AddIndex(
            model_name="recipientdelivery",
            index=models.Index(
                condition=models.Q(("address_key__isnull", False)),
                fields=["address_key", "at"],
                name="ratelimit_address_key_at",
            ),
        ),
        # The third parameter is now the recipient's counting form, and a NULL client the
        # address across clients; a parameter's name changes only by dropping the function.
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS ratelimit_key(text, uuid, text);",
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_reload("ratelimits/sql/functions/ratelimit_key.sql"),
        migrations.RunPython(windows_rekey, migrations.RunPython.noop),
    ]
