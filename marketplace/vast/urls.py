"""Routes of the vast.ai-compatible API, mounted at /api/v0/.

The paths are the ones the official ``vastai`` CLI (1.9.1) calls; some come without a trailing
slash there (``/users/current``), so those take it either way rather than redirect.
"""

from __future__ import annotations

from django.urls import path, re_path

from marketplace.vast import (
    copy,
    hosting,
    instance_update,
    keys,
    launch,
    money,
    serverless_views,
    ssh_keys,
    teams,
    templates,
    views,
    volumes,
)
from marketplace.vast.errors import tfa_not_found, vast_not_found
from marketplace.vast.schema import schema_view

urlpatterns = [
    path("schema/", schema_view, name="vast-schema"),
    re_path(r"^users/current/?$", views.CurrentUser.as_view(), name="vast-user"),
    re_path(r"^users/me/invoices/?$", views.Invoices.as_view(), name="vast-invoices"),
    path("bundles/", views.Bundles.as_view(), name="vast-bundles"),
    path("asks/bulk/", views.AskBulk.as_view(), name="vast-asks-bulk"),
    path("asks/<id:offer_id>/", views.Ask.as_view(), name="vast-ask"),
    path("instances/", views.InstanceList.as_view(), name="vast-instances"),
    path("instances/<id:pk>/", views.InstanceDetail.as_view(), name="vast-instance"),
    path("instances/reboot/<id:pk>/", views.InstanceReboot.as_view(), name="vast-instance-reboot"),
    path("instances/bid_price/<id:pk>/", views.InstanceBid.as_view(), name="vast-instance-bid"),
    path(
        "instances/request_logs/<id:pk>/", views.InstanceLogs.as_view(), name="vast-instance-logs"
    ),
    path(
        "instances/command/<id:pk>/", views.InstanceCommand.as_view(), name="vast-instance-command"
    ),
    path(
        "instances/update_template/<id:pk>/",
        instance_update.InstanceUpdate.as_view(),
        name="vast-instance-update",
    ),
    path("instances/balance/<id:pk>/", money.Deposit.as_view(), name="vast-deposit"),
    path(
        "instances/pending-price-increases/",
        money.PendingPriceIncreases.as_view(),
        name="vast-price-increases",
    ),
    re_path(
        r"^instances/(?:accept|reject)-price-increase/$",
        money.PriceIncreaseAnswer.as_view(),
        name="vast-price-increase-answer",
    ),
    re_path(r"^charges/?$", money.Charges.as_view(), name="vast-charges"),
    re_path(r"^invoices/?$", money.InvoiceSearch.as_view(), name="vast-invoice-search"),
    path("template/", templates.Templates.as_view(), name="vast-templates"),
    path("endptjobs/", serverless_views.Endpoints.as_view(), name="vast-endpoints"),
    path("endptjobs/<id:pk>/", serverless_views.EndpointDetail.as_view(), name="vast-endpoint"),
    path("autojobs/", serverless_views.Workergroups.as_view(), name="vast-workergroups"),
    path(
        "autojobs/<id:pk>/", serverless_views.WorkergroupDetail.as_view(), name="vast-workergroup"
    ),
    path("auth/apikeys/", keys.ApiKeys.as_view(), name="vast-api-keys"),
    path("auth/apikeys/<id:pk>/", keys.ApiKeyDetail.as_view(), name="vast-api-key"),
    path("secrets/", keys.EnvVars.as_view(), name="vast-env-vars"),
    path("instances/<id:pk>/ssh/", views.InstanceSshKeys.as_view(), name="vast-instance-ssh"),
    path(
        "instances/<id:pk>/ssh/<id:key_id>/",
        views.InstanceSshKey.as_view(),
        name="vast-instance-ssh-key",
    ),
    path("ssh/", views.SshKeys.as_view(), name="vast-ssh-keys"),
    path("ssh/<id:pk>/", ssh_keys.SshKeyDetail.as_view(), name="vast-ssh-key"),
    re_path(r"^machines/?$", hosting.Machines.as_view(), name="vast-machines"),
    path("machines/create_asks/", hosting.CreateAsks.as_view(), name="vast-machine-list"),
    re_path(r"^machines/maintenances/?$", hosting.Maintenances.as_view(), name="vast-maintenances"),
    re_path(
        r"^machines/(?P<pk>[0-9]{1,18})/?$",
        hosting.MachineDetail.as_view(),
        name="vast-machine",
    ),
    path(
        "machines/<id:pk>/cancel_maint/",
        hosting.MachineCancelMaintenance.as_view(),
        name="vast-machine-cancel-maintenance",
    ),
    path("machines/<id:pk>/minbid/", hosting.MachineMinBid.as_view(), name="vast-machine-min-bid"),
    path(
        "machines/<id:pk>/force_delete/",
        hosting.MachineForceDelete.as_view(),
        name="vast-machine-delete",
    ),
    path(
        "machines/<id:pk>/reports/", hosting.MachineReports.as_view(), name="vast-machine-reports"
    ),
    path("machines/<id:pk>/asks/", hosting.MachineAsks.as_view(), name="vast-machine-unlist"),
    path(
        "machines/<id:pk>/dnotify/",
        hosting.MachineMaintenance.as_view(),
        name="vast-machine-maintenance",
    ),
    re_path(
        r"^users/me/machine-earnings/?$", hosting.MachineEarnings.as_view(), name="vast-earnings"
    ),
    re_path(r"^volumes/?$", volumes.Volumes.as_view(), name="vast-volumes"),
    path("volumes/search/", volumes.VolumeSearch.as_view(), name="vast-volume-search"),
    path("volumes/copy/", volumes.VolumeClone.as_view(), name="vast-volume-clone"),
    path("team/", teams.Teams.as_view(), name="vast-team"),
    path("team/members/", teams.Members.as_view(), name="vast-team-members"),
    path("team/members/<id:user_id>/", teams.Member.as_view(), name="vast-team-member"),
    path("team/invite/", teams.Invite.as_view(), name="vast-team-invite"),
    path("team/roles/", teams.Roles.as_view(), name="vast-team-roles"),
    path("team/roles-full/", teams.Roles.as_view(), name="vast-team-roles-full"),
    re_path(
        r"^team/roles/(?P<name>[A-Za-z0-9_.-]{1,64})/$",
        teams.RoleDetail.as_view(),
        name="vast-team-role",
    ),
    path("commands/transfer_credit/", teams.TransferCredit.as_view(), name="vast-transfer-credit"),
    path("commands/rsync/", copy.RsyncCopy.as_view(), name="vast-copy-rsync"),
    path("commands/copy_direct/", copy.DirectCopy.as_view(), name="vast-copy-direct"),
    path("launch_instance/", launch.LaunchInstance.as_view(), name="vast-launch"),
    re_path(r"^tfa/", tfa_not_found),
    re_path(r"^.*$", vast_not_found),
]
