from marketplace.models.tenancy import ApiKey, Invitation, Membership, Role, Team, User

__all__ = ["ApiKey", "Invitation", "Membership", "Role", "Team", "User"]
