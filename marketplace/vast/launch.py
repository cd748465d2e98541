"""``vastai launch instance -g <gpu> -n <count> -i <image> …``: search and rent in one call.

The CLI sends the search it built (vast.ai's query: GPU name and count, region, disk, and its
defaults) with the create settings; the best offer by the CLI's order is rented with those
settings, exactly as ``search offers`` then ``create instance <offer>`` would.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from marketplace import offer_query
from marketplace.api.offers import search_offers
from marketplace.rentals.renting import rental_create
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView, rent_order


class LaunchInstance(RenterView):
    @extend_schema(
        summary="vast.ai: launch instance",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = dict(self.body())
        query = body.pop("q", None)
        if not isinstance(query, dict):
            raise Refused("q is the offer search, as search offers sends it.", field="q")
        filters = shapes.offer_filters({**query, "limit": 1})
        filters.pop("limit", None)
        try:
            found = search_offers(offer_query.parse_json(filters), 1, 0)
        except offer_query.QueryError as error:
            raise serializers.ValidationError({"query": str(error)}) from error
        if not found:
            raise NotFound("No offer matches the search; nothing was rented.")
        offer = found[0]
        rented = rental_create(team=self.team, request=rent_order(self.team, body, offer.pk))
        return Response(
            {"success": True, "new_contract": rented.rental.instance_id, "offer_id": offer.pk}
        )
