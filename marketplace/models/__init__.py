from marketplace.models.accounts import ApiKey, Invitation, Membership, Role, Team, User
from marketplace.models.clusters import Cluster
from marketplace.models.deployments import Deployment, Replica
from marketplace.models.env_vars import TeamEnvVar
from marketplace.models.rentals import Offer, Rental, SshKey
from marketplace.models.serverless import ServerlessEndpoint, Workergroup
from marketplace.models.templates import Template
from marketplace.models.volumes import (
    CommittedImage,
    Volume,
    VolumeMount,
    VolumeState,
    VolumeVersion,
)

__all__ = [
    "ApiKey",
    "Cluster",
    "CommittedImage",
    "Deployment",
    "Rental",
    "ServerlessEndpoint",
    "Invitation",
    "Membership",
    "Offer",
    "Replica",
    "Role",
    "SshKey",
    "Team",
    "TeamEnvVar",
    "Template",
    "User",
    "Volume",
    "VolumeMount",
    "VolumeState",
    "VolumeVersion",
    "Workergroup",
]
