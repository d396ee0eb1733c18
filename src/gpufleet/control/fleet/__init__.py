"""Node reads and operator actions: queries, the dashboard's fleet views, actions, Prometheus
service discovery."""
