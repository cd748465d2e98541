"""``vastai copy SRC DST`` (marketplace/services/instance_copy.py).

The CLI parses ``[C.]<id>:<path>``, ``local:<path>`` or a bare path, and sends the id as it was
typed: ``PUT /commands/rsync/`` when a side has no id (a bare path), ``PUT
/commands/copy_direct/`` otherwise, ``"local"`` included. Either way, when a side is the
renter's machine it then runs rsync itself against the address and port answered here:
``rsync -e "ssh -p <port>" … vastai_kaalia@<address>::<id>/<path>``; between two instances the
platform copies. Volumes (``V.<id>``) and cloud services (``s3.<id>``, ``drive``, …) are
refused, naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from marketplace.services.instance_copy import instances_copy, rsync_endpoint
from marketplace.url_ids import MAX_ID
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView

INSTANCE_ID = re.compile(r"(?:C\.)?([0-9]{1,19})")
MAX_PATH = 4096


def location(value: Any, field: str) -> int | None:
    """An instance's id from the CLI's ``src_id``/``dst_id``, or None for the renter's machine."""
    if value is None or value == "local":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ID:
        return value
    found = INSTANCE_ID.fullmatch(value) if isinstance(value, str) else None
    if found and 1 <= int(found[1]) <= MAX_ID:
        return int(found[1])
    if isinstance(value, str) and value.startswith("V."):
        raise Refused(
            "Copying a volume directly is not offered: mount it on an instance "
            "(create instance --link-volume) and copy from the instance.",
            field=field,
        )
    raise Refused(
        f"{field} is an instance ([C.]<id>) or local; cloud copy is not offered.", field=field
    )


def path_of(value: Any, field: str, *, in_instance: bool) -> str:
    """A path: text of at most MAX_PATH characters without NUL or line breaks; absolute in an
    instance (the renter's own container: any other character is a file name's)."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_PATH
        or any(c in value for c in "\0\n\r")
    ):
        raise Refused(f"{field} is a path of at most {MAX_PATH} characters.", field=field)
    if in_instance and not value.startswith("/"):
        raise Refused(f"{field} in an instance is absolute (it starts with /).", field=field)
    return value


class CopyView(RenterView):
    def locations(self) -> tuple[int | None, str, int | None, str]:
        body = self.body()
        src, dst = location(body.get("src_id"), "src_id"), location(body.get("dst_id"), "dst_id")
        return (
            src,
            path_of(body.get("src_path"), "src_path", in_instance=src is not None),
            dst,
            path_of(body.get("dst_path"), "dst_path", in_instance=dst is not None),
        )

    def put(self, request):
        src, src_path, dst, dst_path = self.locations()
        if src is None and dst is None:
            raise Refused("One side of a copy is an instance ([C.]<id>:<path>).", field="src_id")
        if src is None or dst is None:
            return self.for_rsync(src, dst, dst_path)
        source, destination = self.instance(src), self.instance(dst)
        copied = instances_copy(
            source=source, source_path=src_path, destination=destination, destination_path=dst_path
        )
        return Response(
            {
                "success": True,
                "msg": f"Copied {src_path} of instance {src} into {dst_path} of instance {dst}.",
                "bytes_relayed": copied,
            }
        )

    def for_rsync(self, src: int | None, dst: int | None, dst_path: str) -> Response:
        """The renter's machine and an SSH-mode instance: the instance's rsync module is
        opened and its SSH address answered; the CLI's rsync copies."""
        if src is not None:
            remote, (address, port) = "src", rsync_endpoint(self.instance(src))
        else:
            remote, (address, port) = "dst", rsync_endpoint(self.instance(dst), into=dst_path)
        return Response({"success": True, f"{remote}_addr": address, f"{remote}_port": port})


class RsyncCopy(CopyView):
    """A copy whose one side the CLI sent with no id (a bare local path)."""

    @extend_schema(
        summary="vast.ai: copy (a side with no id: your machine)",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        return super().put(request)


class DirectCopy(CopyView):
    """A copy between two of the team's running instances (any launch mode, one machine or
    two: the platform relays the files, and answers once they are copied), or with
    ``local`` on one side (as ``RsyncCopy``)."""

    @extend_schema(
        summary="vast.ai: copy",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        return super().put(request)

    @extend_schema(
        summary="vast.ai: cancel copy",
        request={"application/json": ANY_JSON},
        responses={400: ANY_JSON},
    )
    def delete(self, request):
        self.body()
        raise Refused(
            "cancel copy is not offered: a copy between instances here finishes before "
            "vastai copy returns, so none is in progress to cancel.",
            field="dst_id",
        )
