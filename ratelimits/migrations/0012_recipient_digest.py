"""The held rows' look-ups go through the recipient's digest (notifications 0013).

`notification_rate_held` is now a btree keyed by `md5(recipient)::uuid`, as the recipient index
is: a hash index walked every page of a recipient's bucket on each insert, so a deferral that
held back many rows for one recipient cost more for each of them. The admission's probe for a
held row and `ratelimit_release_next` name the index's expression, which the planner matches,
and still compare the recipient itself. The rules do not change.
"""

from importlib import import_module

from django.db import migrations

_admission = import_module("ratelimits.migrations.0010_release_probe_first")
_release = import_module("ratelimits.migrations.0005_ratelimit_admit_many").ADMIT_MANY

HELD_PROBE_BEFORE = "WHERE w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)"
HELD_PROBE = """WHERE md5(w.recipient)::uuid = md5(last.recipient)::uuid
                        AND w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)"""
assert _admission.ADMIT_MANY.count(HELD_PROBE_BEFORE) == 1
ADMIT_MANY = _admission.ADMIT_MANY.replace(HELD_PROBE_BEFORE, HELD_PROBE)

# Re-creating a function resets its settings (migrations 0010 and 0011 set these).
SETTINGS = _admission.CUSTOM_PLANS + _admission.SEQSCAN_OFF

RELEASE_NEXT_BEFORE = _release[
    _release.index("CREATE OR REPLACE FUNCTION ratelimit_release_next(") : _release.index(
        "CREATE OR REPLACE FUNCTION ratelimit_admit("
    )
]
RECIPIENT_BEFORE = "WHERE w.recipient = p_recipient\n"
RECIPIENT = "WHERE md5(w.recipient)::uuid = md5(p_recipient)::uuid AND w.recipient = p_recipient\n"
assert RELEASE_NEXT_BEFORE.count(RECIPIENT_BEFORE) == 1
RELEASE_NEXT = RELEASE_NEXT_BEFORE.replace(RECIPIENT_BEFORE, RECIPIENT)


class Migration(migrations.Migration):
    dependencies = [
        ("ratelimits", "0011_admission_no_sequential_scans"),
        ("notifications", "0013_recipient_digest_btree"),
    ]

    operations = [
        migrations.RunSQL(
            ADMIT_MANY + SETTINGS + RELEASE_NEXT,
            reverse_sql=_admission.ADMIT_MANY + SETTINGS + RELEASE_NEXT_BEFORE,
        ),
    ]
