-- The templates app's write, and the worker's read of many templates at once. Other reads go
-- through the ORM.

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

-- name: templates_read_many
-- The templates of each (client, event, channel) given, in one statement for a worker's
-- whole claim: one probe of message_template_client_event_channel per key. Keys with no
-- template are left out.
SELECT t.client_id, t.event, t.channel, t.subject, t.body, t.created_at, t.updated_at
  FROM unnest(%(client_ids)s::uuid[], %(events)s::text[], %(channels)s::text[])
       AS k(client_id, event, channel)
  JOIN message_template t
    ON t.client_id = k.client_id AND t.event = k.event AND t.channel = k.channel;
