"""Prometheus metrics (`GET /metrics`): fixed-cardinality counters kept as database rows, and gauges
read from the rows that are the truth at scrape time. No label ever carries a URL, an adapter or user
name, a run id or any other value a caller chose: every label value comes from a closed set declared
with its family (core.metrics.families)."""
