"""A delivery's claim token is the window table's primary key; the surrogate `id` goes.

Every admitted delivery inserts a row here, and each of the table's indexes is paid per
delivered message. The claim token was already unique (a claim is admitted at most once) and is
what a failed attempt's finish deletes by; the bigint `id` only added an index entry and a
sequence value per row, and the prune's batches now name rows by their token.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0012_recipient_digest")]

    operations = [
        migrations.RemoveField(model_name="recipientdelivery", name="id"),
        migrations.AlterField(
            model_name="recipientdelivery",
            name="claim_token",
            field=models.UUIDField(primary_key=True, serialize=False),
        ),
    ]
