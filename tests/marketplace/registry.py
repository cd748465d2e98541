"""A small Docker registry (the Registry HTTP API v2, read-only) serving one image, so a test can
make Docker Engine really pull: from 127.0.0.1 Docker speaks plain HTTP to a registry by default.

The image is the local busybox test image with one file added to its layer, so its layer is
new to the engine and is downloaded and extracted (not "Already exists").

Given a user name and password it is a private registry, as one behind htpasswd is: every
``/v2/`` request without that login (HTTP Basic) is answered 401 with a
``WWW-Authenticate: Basic realm=...`` challenge, so ``docker login`` and ``docker pull`` must
send it. Every request is recorded (``requests``), with whether it carried the login.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _image_blobs(base: str, marker: bytes) -> tuple[bytes, dict[str, bytes]]:
    """(manifest, blobs by digest) for ``base`` with ``marker`` added to its layer as
    ``/etc/gpumkt-pull-test``."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp, "image.tar")
        subprocess.run(["docker", "save", base, "-o", str(saved)], check=True)
        with tarfile.open(saved) as archive:
            index = json.load(archive.extractfile("manifest.json"))[0]
            config = json.load(archive.extractfile(index["Config"]))
            layer = archive.extractfile(index["Layers"][0]).read()
    buffer = io.BytesIO(layer)
    with tarfile.open(fileobj=buffer, mode="a") as tar:
        info = tarfile.TarInfo("etc/gpumkt-pull-test")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    layer = buffer.getvalue()
    config["rootfs"]["diff_ids"] = [_digest(layer)]
    config_blob = json.dumps(config).encode()
    layer_blob = gzip.compress(layer, mtime=0)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config_blob),
            "digest": _digest(config_blob),
        },
        "layers": [
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": len(layer_blob),
                "digest": _digest(layer_blob),
            }
        ],
    }
    blobs = {_digest(config_blob): config_blob, _digest(layer_blob): layer_blob}
    return json.dumps(manifest).encode(), blobs


@dataclass(frozen=True)
class Request:
    """One request the registry answered. ``login`` is "valid" when it carried the configured
    login, "invalid" when it carried other credentials, "" otherwise (and on an open registry)."""

    method: str
    path: str
    login: str
    status: int


class Registry:
    """Serves ``<address>/<name>:<tag>`` until ``close()``; only to ``username``/``password``
    when they are given.

    ``marker`` is what the image's ``/etc/gpumkt-pull-test`` holds (unique to this registry).
    ``on_request(path)``, if given, is called on the server's thread as each request
    arrives, before it is answered (to look at the machine while a pull is under way).
    """

    def __init__(
        self,
        base_image: str,
        name: str = "gpumkt/pulltest",
        *,
        username: str = "",
        password: str = "",
        on_request: Callable[[str], None] | None = None,
    ):
        if bool(username) != bool(password):
            raise ValueError("give both a user name and a password, or neither")
        # 12 hex digits on purpose, like a short git SHA: the pull's "<tag>: Pulling from …"
        # line looks like a layer's and must not be counted as one.
        self.name, self.tag = name, uuid.uuid4().hex[:12]
        self.marker = f"pulled {uuid.uuid4()}\n"
        self.requests: list[Request] = []
        manifest, blobs = _image_blobs(base_image, self.marker.encode())
        login = (username, password) if username else None
        handler = _handler(name, self.tag, manifest, blobs, login, self._record, on_request)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def image(self) -> str:
        return f"{self.address}/{self.name}:{self.tag}"

    def _record(self, request: Request) -> None:
        self.requests.append(request)  # list.append is atomic: the handler threads share it

    def stop_serving(self) -> None:
        """The registry goes away (an outage); what was pulled from it stays on the engine."""
        self.server.shutdown()
        self.server.server_close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        subprocess.run(["docker", "image", "rm", "--force", self.image], capture_output=True)


def _basic_login(header: str) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic ...`` header; None for anything else."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


REALM = "gpumkt test registry"
UNAUTHORIZED = json.dumps(
    {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required", "detail": None}]}
).encode()


def _handler(
    name: str,
    tag: str,
    manifest: bytes,
    blobs: dict[str, bytes],
    login: tuple[str, str] | None,
    record: Callable[[Request], None],
    on_request: Callable[[str], None] | None,
):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the test output quiet
            pass

        login_presented = ""  # this request's, set as it arrives

        def _send(self, status: int, body: bytes, content_type: str, digest: str = "") -> None:
            record(Request(self.command, self.path, self.login_presented, status))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if status == 401:
                self.send_header("WWW-Authenticate", f'Basic realm="{REALM}"')
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            if on_request is not None:
                on_request(self.path)
            header = self.headers.get("Authorization")
            if login is None or header is None:
                self.login_presented = ""
            else:
                self.login_presented = "valid" if _basic_login(header) == login else "invalid"
            if login is not None and self.login_presented != "valid":
                # As a registry behind htpasswd: every /v2/ route, known or not, before routing.
                return self._send(401, UNAUTHORIZED, "application/json")
            path = self.path.split("?")[0]
            if path in ("/v2/", "/v2"):
                return self._send(200, b"{}", "application/json")
            if path in (f"/v2/{name}/manifests/{tag}", f"/v2/{name}/manifests/{_digest(manifest)}"):
                return self._send(200, manifest, MANIFEST_TYPE, _digest(manifest))
            prefix = f"/v2/{name}/blobs/"
            if path.startswith(prefix) and path[len(prefix) :] in blobs:
                digest = path[len(prefix) :]
                return self._send(200, blobs[digest], "application/octet-stream", digest)
            error = {"errors": [{"code": "NAME_UNKNOWN", "message": "not here"}]}
            return self._send(404, json.dumps(error).encode(), "application/json")

        do_HEAD = do_GET

    return Handler
