"""Code that generates the monitoring role's committed artifacts (run on the control machine,
never shipped to a host): the Grafana dashboard JSON (dashboard.py, grafana-foundation-sdk),
the price recording rules taken from compat/catalog.yml (prices.py) and the docs' picture of
the dashboard drawn from a live Prometheus (render.py, matplotlib).

    .venv/bin/python -m roles.monitoring.generator           # rewrite the artifacts
    .venv/bin/python -m roles.monitoring.generator --check   # fail when one is stale
"""
