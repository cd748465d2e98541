"""Wait until a process's probe answers 200: ``python -m marketplace.observability.wait URL``.

The production units run it after starting a web process (``ExecStartPost``), so systemd calls
the process started only once ``/healthz`` answers, and a process that never answers fails its
start (and is restarted) instead of sitting in the proxy's rotation. It sends the first name
of ``ALLOWED_HOSTS`` as the Host header (a direct probe's own ``127.0.0.1:8001`` is not an
allowed host in production) and imports nothing of Django, so it costs a few milliseconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def probe_host() -> str | None:
    hosts = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
    # A wildcard or a leading-dot name is a pattern, not a name a request can carry.
    for host in hosts:
        if host != "*" and not host.startswith("."):
            return host
    return None


def answers(url: str, timeout: float) -> bool:
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"not an http(s) URL: {url}")
    headers = {"Host": host} if (host := probe_host()) else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (scheme checked above)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait(urls: list[str], *, timeout: float, interval: float = 0.2) -> list[str]:
    """The URLs still not answering 200 when ``timeout`` ran out (empty: all answered)."""
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    while waiting:
        waiting = [url for url in waiting if not answers(url, timeout=min(2.0, timeout))]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return waiting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+", metavar="URL")
    parser.add_argument("--timeout", type=float, default=60, help="seconds (default 60)")
    args = parser.parse_args(argv)
    silent = wait(args.urls, timeout=args.timeout)
    for url in silent:
        print(f"{url} did not answer 200 within {args.timeout:g} s", file=sys.stderr)
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
