"""Two cuts in a claim's admission, whose rule does not change.

- `ratelimit_release_next` runs only for a key that has a held row. It looked, for every key
  of the claim that had a slot left, for a row a deferral holds back for that recipient, in a
  function call of its own: 8 µs of PostgreSQL's CPU per delivered row, for keys that almost
  never have one. A probe of the partial index of held rows (`notification_rate_held`) now
  comes first; the function's own look-up asks for the same rows and more conditions, so a
  key it skips is one the function would have found nothing for.
- `ratelimit_key` is STABLE, as `convert_to` in its body is: PostgreSQL inlines a SQL function
  only when the body is no more volatile than the function says it is, so as IMMUTABLE it ran
  as a function call per row. The key depends only on its arguments and the database's
  encoding, which never changes; no index or stored expression uses the function.
"""

from importlib import import_module

from django.db import migrations

BEFORE = import_module("ratelimits.migrations.0006_ratelimit_admit_set_based").ADMIT_MANY

RELEASE_STEP_BEFORE = """
    PERFORM ratelimit_release_next(last.channel, last.client_id, last.recipient, last.id)
    FROM (
        SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id, c.critical
        FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
             AS c(channel, client_id, recipient, id, critical, key)
        ORDER BY c.key, c.id DESC
    ) AS last
    WHERE NOT last.critical
      AND (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE d.key = last.key AND d.at > window_start) < p_limit;
"""

RELEASE_STEP = """
    PERFORM ratelimit_release_next(last.channel, last.client_id, last.recipient, last.id)
    FROM (
        SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id, c.critical
        FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
             AS c(channel, client_id, recipient, id, critical, key)
        ORDER BY c.key, c.id DESC
    ) AS last
    WHERE NOT last.critical
      -- Only a key with a held row has anything to release (notification_rate_held).
      AND EXISTS (SELECT 1 FROM notification AS w
                  WHERE w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)
      AND (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE d.key = last.key AND d.at > window_start) < p_limit;
"""

assert RELEASE_STEP_BEFORE in BEFORE
ADMIT_MANY = BEFORE.replace(RELEASE_STEP_BEFORE, RELEASE_STEP)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0006_ratelimit_admit_set_based")]

    operations = [
        migrations.RunSQL(ADMIT_MANY, reverse_sql=BEFORE),
        migrations.RunSQL(
            "ALTER FUNCTION ratelimit_key(text, uuid, text) STABLE;",
            reverse_sql="ALTER FUNCTION ratelimit_key(text, uuid, text) IMMUTABLE;",
        ),
    ]
