"""Columns that store a provider's answer or a recipient take whatever the API accepts.

A 300-character `message_id` from an http provider made the batched finish fail for the whole
batch, again and again; a push token over 320 characters broke the simulated provider's store;
an in-app recipient over 255 characters broke the inbox insert. All become text: providers
bound what they return, and the API bounds what it accepts.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery", "0003_attempt_outcomes_rerouted_suppressed")]

    operations = [
        migrations.AlterField(
            model_name="deliveryattempt",
            name="provider_message_id",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="simulatedprovidermessage",
            name="recipient",
            field=models.TextField(),
        ),
        migrations.AlterField(
            model_name="simulatedprovidermessage",
            name="message_id",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="inboxmessage",
            name="user_id",
            field=models.TextField(),
        ),
    ]
