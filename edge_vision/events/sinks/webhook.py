"""Webhooks: each event one HTTP POST of its JSON, signed, in order.

Headers: ``Content-Type: application/json``, ``X-Edge-Vision-Event-Id`` (the event's id:
a repeat after a retry has the same), and with ``events.sinks.webhook.secret`` set
``X-Edge-Vision-Signature: sha256=HEX``, the HMAC-SHA256 of the body under the secret
(the receiver computes the same over the bytes it got and compares in constant time).

A 2xx answer takes the event. 408, 429, any 5xx, a timeout or no connection mean "later":
the delivery stops there and is retried with backoff. Any other status refuses the event
for good: it is dropped, counted (``reason="rejected"``) and logged, and the next one goes.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence

import aiohttp

from ...config.events import WebhookSinkConfig
from ..outbox import Queued
from .base import Sink, SinkError

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Edge-Vision-Signature"
EVENT_ID_HEADER = "X-Edge-Vision-Event-Id"
_LATER = {408, 429}


def signature(secret: bytes, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookSink(Sink):
    name = "webhook"
    batch = 16

    def __init__(self, cfg: WebhookSinkConfig) -> None:
        if cfg.url is None:
            raise ValueError("the webhook sink needs events.sinks.webhook.url")
        self.url = cfg.url
        self.timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        self._secret = cfg.secret.get_secret_value().encode() if cfg.secret else None
        self._session: aiohttp.ClientSession | None = None

    def describe(self) -> str:
        signed = "signed" if self._secret else "unsigned"
        return f"webhook (POST {self.url.split('?')[0]}, {signed})"

    async def send(self, items: Sequence[Queued]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        for taken, item in enumerate(items):
            headers = {"Content-Type": "application/json"}
            event_id = _event_id(item.body)
            if event_id:
                headers[EVENT_ID_HEADER] = event_id
            if self._secret is not None:
                headers[SIGNATURE_HEADER] = signature(self._secret, item.body)
            try:
                async with self._session.post(self.url, data=item.body, headers=headers) as r:
                    status = r.status
                    await r.read()
            except (aiohttp.ClientError, TimeoutError) as e:
                raise SinkError(f"POST failed: {type(e).__name__}: {e}", taken) from None
            if 200 <= status < 300:
                continue
            if status in _LATER or status >= 500:
                raise SinkError(f"the receiver answered {status}", taken)
            log.warning(
                "webhook refused event %s of rule %s with HTTP %d; dropped",
                event_id,
                item.rule,
                status,
            )
            raise SinkError(f"the receiver refused it with {status}", taken, rejected=True)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _event_id(body: bytes) -> str:
    """The event's id from its JSON (it is the first field the service writes)."""
    head = body[:80]
    start = head.find(b'"event_id":"')
    if start < 0:
        return ""
    start += len(b'"event_id":"')
    end = head.find(b'"', start)
    return head[start:end].decode() if end > start else ""
