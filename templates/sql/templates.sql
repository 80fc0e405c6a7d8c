-- The templates app's one write. Reads go through the ORM.

-- name: template_upsert
-- Creates or replaces the (client, event, channel) template in one statement, so two
-- concurrent PUTs cannot both insert. `xmax = 0` holds only for a freshly inserted row
-- version, which tells a create (201) from a replacement (200).
INSERT INTO message_template AS t (id, client_id, event, channel, subject, body,
                                   created_at, updated_at)
VALUES (gen_random_uuid(), %(client_id)s, %(event)s, %(channel)s, %(subject)s, %(body)s,
        %(now)s, %(now)s)
ON CONFLICT ON CONSTRAINT message_template_client_event_channel DO UPDATE
SET subject = excluded.subject, body = excluded.body, updated_at = excluded.updated_at
RETURNING t.client_id, t.event, t.channel, t.subject, t.body, t.created_at, t.updated_at,
          (t.xmax = 0) AS created;
