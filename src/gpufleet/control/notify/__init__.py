"""Notifications: the notifier, its configuration and its sinks (webhooks, Slack, email)."""
