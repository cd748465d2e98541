from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from marketplace.api import accounts as accounts_api
from marketplace.api import billing as billing_api
from marketplace.api import clusters as clusters_api
from marketplace.api import deployments as deployments_api
from marketplace.api import env_vars as env_vars_api
from marketplace.api import hosts as hosts_api
from marketplace.api import offer_figures as offer_figures_api
from marketplace.api import offers as offers_api
from marketplace.api import payouts as payouts_api
from marketplace.api import rentals as rentals_api
from marketplace.api import templates as templates_api
from marketplace.api import volumes as volumes_api
from marketplace.api.errors import api_not_found
from marketplace.clusters.auth import gateway_auth
from marketplace.vast import money as vast_money
from marketplace.vast import templates as vast_templates
from marketplace.vast.views import for_vastai_cli
from marketplace.views import accounts as views
from marketplace.views import billing as billing_views
from marketplace.views import clusters as clusters_views
from marketplace.views import deployments as deployments_views
from marketplace.views import hosts as hosts_views
from marketplace.views import overview as overview_views
from marketplace.views import payouts as payouts_views
from marketplace.views import rentals as rentals_views
from marketplace.views import templates as templates_views
from marketplace.views import volumes as volumes_views

router = DefaultRouter(trailing_slash=True)
router.register("team/members", accounts_api.MemberViewSet, basename="api-member")
router.register("team/invitations", accounts_api.InvitationViewSet, basename="api-invitation")
router.register("api-keys", accounts_api.ApiKeyViewSet, basename="api-apikey")
router.register("instances", rentals_api.InstanceViewSet, basename="api-instance")
router.register("ssh-keys", rentals_api.SshKeyViewSet, basename="api-sshkey")
router.register("deployments", deployments_api.DeploymentViewSet, basename="api-deployment")
router.register("clusters", clusters_api.ClusterViewSet, basename="api-cluster")
router.register("volumes", volumes_api.VolumeViewSet, basename="api-volume")
router.register("images", rentals_api.CommittedImageViewSet, basename="api-image")
router.register("templates", templates_api.TemplateViewSet, basename="api-template")
router.register("payouts", payouts_api.PayoutViewSet, basename="api-payout")

api_v1 = [
    # The vastai CLI (1.9.1) lists instances at this v1 path: its request goes to the vast
    # facade's list, every other to ours (marketplace/vast/views.py:for_vastai_cli).
    path(
        "instances/",
        for_vastai_cli(rentals_api.InstanceViewSet.as_view({"get": "list", "post": "create"})),
        name="api-instance-list",
    ),
    # ... and saves a template's edits at this one (``update template``).
    path("template/", vast_templates.TemplateV1.as_view(), name="vast-template-v1"),
    # ... and reads ``show invoices-v1 -i`` at this one.
    path("invoices/", vast_money.PaymentInvoices.as_view(), name="vast-invoices-v1"),
    path("me/", accounts_api.me, name="api-me"),
    path("env-vars/", env_vars_api.EnvVars.as_view(), name="api-env-vars"),
    path("env-vars/<str:name>/", env_vars_api.EnvVarDetail.as_view(), name="api-env-var"),
    path("offers/", offers_api.offers, name="api-offers"),
    path("offers/<id:machine_id>/quote/", offers_api.offer_quote, name="api-offer-quote"),
    path(
        "offers/<id:machine_id>/figures/",
        offer_figures_api.offer_figures,
        name="api-offer-figures",
    ),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include(router.urls)),
    path("", include(hosts_api.urlpatterns)),
    path("", include(billing_api.urlpatterns)),
    re_path(r"^.*$", api_not_found),
]

urlpatterns = [
    # The API and the probes first: Django tries the patterns in order, and every include
    # passed on the way raises and collects the list of what it tried (a tenth of an API
    # request's CPU when the API came last). No pattern below matches these paths.
    path("api/v1/", include(api_v1)),
    path("api/v0/", include("marketplace.vast.urls")),
    # The vastai CLI's serverless commands call vast.ai's autoscaler at the site's root.
    path("", include("marketplace.vast.autoscaler_urls")),
    path("", include("marketplace.observability.urls")),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on pages without an icon link (the admin, the API docs).
    path(
        "favicon.ico",
        lambda request: HttpResponsePermanentRedirect(static("favicon.svg")),
        name="favicon",
    ),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
    path("", overview_views.overview, name="console-home"),
    path("team/", views.team_settings, name="team-settings"),
    path("team/switch/", views.team_switch, name="team-switch"),
    path("team/new/", views.team_create, name="team-create"),
    path("team/invitations/", views.invitation_create, name="invitation-create"),
    path("team/invitations/<id:pk>/revoke/", views.invitation_revoke, name="invitation-revoke"),
    path("team/members/<id:pk>/", views.member_update, name="member-update"),
    path("team/api-keys/", views.api_keys, name="api-keys"),
    path("team/api-keys/<id:pk>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
    path("", include(rentals_views.urlpatterns)),
    path("", include(volumes_views.urlpatterns)),
    path("", include(templates_views.urlpatterns)),
    path("", include(deployments_views.urlpatterns)),
    path("", include(clusters_views.urlpatterns)),
    # Caddy's forward-auth sub-request (answered by GatewayAuthMiddleware before the chain).
    path("gateway/auth/<id:cluster_id>/", gateway_auth, name="gateway-auth"),
    path("", include(hosts_views.urlpatterns)),
    path("", include(billing_views.urlpatterns)),
    path("", include(payouts_views.urlpatterns)),
    re_path(r"^api(/.*)?$", api_not_found),  # /api/, /api/v2/…: the API's 404, not a page
]

# Under /api/ every error answers in the API's error shape, even those DRF never sees.
handler400 = "marketplace.api.errors.bad_request"
handler403 = "marketplace.api.errors.permission_denied"
handler404 = "marketplace.api.errors.page_not_found"
handler500 = "marketplace.api.errors.server_error"
