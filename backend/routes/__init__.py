"""HTTP routers: ingest (the agent's writes), reads (the JSON API) and pages (the dashboards)."""
