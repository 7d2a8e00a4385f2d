"""The alerts (docs/alerts.md): rules judged on the server from the catalogue's sums, each alert
stored once, its webhook messages sent from an outbox."""
