"""Pages of every API list: ``limit`` and ``offset`` are checked, not guessed.

DRF's own class reads a bad ``offset`` as 0 and any offset as far as the database will scan;
here a bad or huge one answers 400 naming the parameter (a deep OFFSET makes the database
walk past every skipped row: narrow the list with its filters instead).
"""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500
MAX_OFFSET = 100_000


class PageQuerySerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, required=False)
    offset = serializers.IntegerField(min_value=0, max_value=MAX_OFFSET, required=False)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def paginate_queryset(self, queryset, request, view=None):
        params = {
            name: request.query_params[name]
            for name in (self.limit_query_param, self.offset_query_param)
            if name in request.query_params
        }
        PageQuerySerializer(data=params).is_valid(raise_exception=True)
        return super().paginate_queryset(queryset, request, view)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": MAX_LIMIT},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
