"""Projects, their members, API tokens and the first user. Views, the API's authentication and
management commands call these."""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from dispatchlab.reports.models import ApiToken, Membership, Project

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- projects, members, tokens


def project_create(*, name: str, slug: str = "") -> Project:
    slug = slug or slugify(name) or "project"
    base, n = slug, 2
    while Project.objects.filter(slug=slug).exists():
        slug = f"{base}-{n}"
        n += 1
    return Project.objects.create(name=name, slug=slug)


def membership_ensure(
    *, user: AbstractBaseUser, project: Project, role: str = Membership.Role.MEMBER
) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, project=project, defaults={"role": role})
    return membership


def project_rotate_webhook_secret(*, project: Project) -> str:
    project.webhook_secret = secrets.token_urlsafe(32)
    project.save(update_fields=["webhook_secret"])
    return project.webhook_secret


TOKEN_PREFIX = "dl_"


def _token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def apitoken_create(
    *, user: AbstractBaseUser, project: Project, read_only: bool = False, days: int | None = None
) -> tuple[ApiToken, str]:
    """A new token; the key itself is returned once and only its hash is stored. It expires after
    `days` (default DISPATCHLAB_API_TOKEN_DAYS; 0: never)."""
    days = settings.DISPATCHLAB_API_TOKEN_DAYS if days is None else days
    key = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        project=project,
        key_hash=_token_hash(key),
        prefix=key[: len(TOKEN_PREFIX) + 8],
        read_only=read_only,
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )
    return token, key


class TokenRefused(Exception):
    """The key names no usable token. str(error) is the answer for the caller."""


def apitoken_verify(*, key: str) -> ApiToken:
    """The token for this key, if it exists, is neither revoked nor expired, and its user is active and
    still in the project; TokenRefused (saying which) otherwise."""
    if not key.startswith(TOKEN_PREFIX):
        raise TokenRefused("invalid or revoked token")
    token = ApiToken.objects.select_related("user", "project").filter(key_hash=_token_hash(key)).first()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        raise TokenRefused("invalid or revoked token")
    now = timezone.now()
    if token.is_expired(now):
        assert token.expires_at is not None
        raise TokenRefused(
            f"token expired on {token.expires_at:%Y-%m-%d %H:%M} UTC; ask for a new one (manage.py apitoken)"
        )
    if not Membership.objects.filter(user=token.user, project=token.project).exists():
        raise TokenRefused("invalid or revoked token")
    # One write a minute is enough to tell used tokens from forgotten ones.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)
        token.last_used_at = now
    return token


def apitoken_authenticate(*, key: str) -> ApiToken | None:
    """The token for this key, or None when apitoken_verify refuses it."""
    try:
        return apitoken_verify(key=key)
    except TokenRefused:
        return None


def apitoken_revoke(*, prefix: str) -> int:
    """Revoke the live tokens with this shown prefix (`dl_` and 8 more characters) or this full key;
    returns how many. A shorter prefix is refused (ValueError): it could name many people's tokens."""
    shown = len(TOKEN_PREFIX) + 8
    if not prefix.startswith(TOKEN_PREFIX) or len(prefix) < shown:
        raise ValueError(f"give the token's prefix as listed ({TOKEN_PREFIX} and 8 characters) or its key")
    if len(prefix) > shown:
        tokens = ApiToken.objects.filter(key_hash=_token_hash(prefix))
    else:
        tokens = ApiToken.objects.filter(prefix=prefix)
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


@dataclass(frozen=True)
class Bootstrap:
    username: str
    password: str | None  # None when the user already existed
    project: Project


def user_bootstrap(
    *, username: str = "admin", password: str = "", project_name: str = "default"
) -> Bootstrap | None:
    """Create the first user (a superuser), a project and the membership, when there is no user yet."""
    user_model = get_user_model()
    if user_model.objects.exists():
        return None
    password = password or secrets.token_urlsafe(12)
    with transaction.atomic():
        user = user_model.objects.create_superuser(username=username, email="", password=password)
        project = Project.objects.filter(name=project_name).first() or project_create(name=project_name)
        membership_ensure(user=user, project=project)
    return Bootstrap(username=username, password=password, project=project)
