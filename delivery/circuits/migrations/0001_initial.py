"""The circuit breakers' state, one row per provider."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='CircuitBreaker',
            fields=[
                ('name', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('state', models.CharField(choices=[('CLOSED', 'Closed'), ('OPEN', 'Open'), ('HALF_OPEN', 'Half Open')], max_length=16)),
                ('consecutive_failures', models.PositiveIntegerField(default=0)),
                ('opened_at', models.DateTimeField(blank=True, null=True)),
                ('probe_token', models.UUIDField(blank=True, null=True)),
                ('probe_expires_at', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'circuit_breaker',
                'constraints': [models.CheckConstraint(condition=models.Q(('state__in', ['CLOSED', 'OPEN', 'HALF_OPEN'])), name='circuit_state_valid'), models.CheckConstraint(condition=models.Q(('state', 'CLOSED'), ('opened_at__isnull', False), _connector='OR'), name='circuit_open_has_opened_at'), models.CheckConstraint(condition=models.Q(models.Q(('probe_expires_at__isnull', False), ('probe_token__isnull', False), ('state', 'HALF_OPEN')), models.Q(models.Q(('state', 'HALF_OPEN'), _negated=True), ('probe_expires_at__isnull', True), ('probe_token__isnull', True)), _connector='OR'), name='circuit_probe_iff_half_open')],
            },
        ),
    ]
