"""The in-app channel: delivery is the inbox row itself.

Accepting here costs nothing; the inbox row is written by the statement that marks the
notification SENT (delivery/sql/queries.sql, notification_finish), so the two never disagree.
"""

from __future__ import annotations

from delivery.providers.base import Accepted, Message, ProviderResult


class InAppProvider:
    name = "in_app"

    def send(self, message: Message) -> ProviderResult:
        return Accepted(f"inbox-{message.notification_id}")

    def send_batch(self, messages: list[Message]) -> list[ProviderResult]:
        return [self.send(message) for message in messages]
