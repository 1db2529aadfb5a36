"""Notifications out: a project's webhook endpoints (Slack-compatible or signed generic JSON), the events
they subscribe to (a new failure group, a closed group coming back, a decision record turning stale),
and their deliveries, sent by Celery with retries and recorded attempt by attempt.

Private and loopback addresses are allowed on purpose: self-hosted chat servers (Mattermost, Rocket.Chat,
Zulip) usually live on the internal network next to dispatchlab. Only http/https URLs without
credentials are accepted, and redirects are never followed.
"""
