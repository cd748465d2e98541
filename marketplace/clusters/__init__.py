"""GPU clusters: N replicas of one container behind one authenticated, load-balanced URL.

``services`` (the writes), ``routes`` (what the gateway is told, and when), ``auth`` (the
gateway's forward-auth answer), ``autoscale`` (replicas from requests per second). The
replicas themselves are a replica set deployment's (``marketplace.deployments``).
"""
