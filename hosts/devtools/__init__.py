"""Development and test tooling of the hosts room, never imported by production code.

``simulation`` makes simulated hosts (real sshd and Docker, stand-in nvidia-smi) for the test
fixtures, the benches and ``make run`` (``manage.py simhosts``, ``scripts/services.sh``). The
web, the workers and the other rooms never import this package; ``tests/hosts`` checks it.
"""
