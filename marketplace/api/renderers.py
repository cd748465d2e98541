"""JSON written by orjson for the answers that are mostly numbers and words in bulk.

An offer page is 64 offers of some 50 fields each; the standard library's encoder, through
DRF's, took about as long to write it as the index took to find it. orjson writes the same
JSON (UTF-8, compact, as DRF's settings ask) several times faster. What orjson does not know
natively, or writes another way (dates: DRF writes UTC as ``Z``), goes through DRF's own
encoder, so a value reads the same as from every other endpoint.
"""

from __future__ import annotations

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_DRF = JSONEncoder()
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


class FastJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        indent = self.get_indent(accepted_media_type, renderer_context or {})
        if data is None or indent:  # an empty body, or JSON asked for indented: DRF's own
            return super().render(data, accepted_media_type, renderer_context)
        return orjson.dumps(data, default=_DRF.default, option=_OPTIONS)
