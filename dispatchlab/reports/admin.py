from __future__ import annotations

from django.contrib import admin

from dispatchlab.reports.models import ApiToken, FailureGroup, Membership, Project, Report, ReportFile


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    prepopulated_fields = {"slug": ["name"]}
    exclude = ["webhook_secret"]  # shown and rotated with `manage.py webhooksecret`
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "project", "read_only", "created_at", "last_used_at"]
    readonly_fields = ["key_hash", "prefix", "created_at", "last_used_at"]


class ReportFileInline(admin.TabularInline):
    model = ReportFile
    extra = 0
    readonly_fields = ["file", "original_name", "size", "position"]


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "project", "status", "failure_class", "created_at", "attempts"]
    list_filter = ["status", "failure_class", "project"]
    search_fields = ["title", "top_match_title", "checksum"]
    readonly_fields = ["checksum", "claimed_at", "claim_token", "document"]
    inlines = [ReportFileInline]


@admin.register(FailureGroup)
class FailureGroupAdmin(admin.ModelAdmin):
    list_display = ["title", "project", "failure_class", "count", "last_seen"]
    list_filter = ["failure_class", "project"]
