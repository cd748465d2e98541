from marketplace.models.rentals import Contract, Offer, SshKey
from marketplace.models.tenancy import ApiKey, Invitation, Membership, Role, Team, User

__all__ = [
    "ApiKey",
    "Contract",
    "Invitation",
    "Membership",
    "Offer",
    "Role",
    "SshKey",
    "Team",
    "User",
]
