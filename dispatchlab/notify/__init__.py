"""Notifications out: a project's webhook endpoints (Slack-compatible or signed generic JSON), the events
they subscribe to (a new failure group, a closed group coming back, a decision record turning stale),
and their deliveries, sent by Celery with retries and recorded attempt by attempt.

Deliveries run on a queue and worker processes of their own, one attempt bounded by a total deadline.
Only http/https URLs without credentials are accepted, redirects are never followed, and addresses
off the public internet are refused unless the operator allows their network (addresses.py).
"""

NOTIFY_QUEUE_SUFFIX = ".notify"


def notify_queue(default_queue: str) -> str:
    """The queue deliveries go to, next to the parsing queue: settings route to it, the notify worker
    (dispatchlab.stack, docker-compose.yml) consumes it, the parsing worker does not."""
    return default_queue + NOTIFY_QUEUE_SUFFIX
