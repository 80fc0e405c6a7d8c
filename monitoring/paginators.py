"""An admin paginator that never counts a whole large table.

Django's admin counts the rows of the list it shows on every page load. On a table of
millions of rows that COUNT(*) is a full scan each time. This paginator:
- for an unfiltered list, uses the planner's estimate (pg_class.reltuples), once the table is
  big enough for the estimate to matter; below that the exact count is cheap;
- for a filtered list, counts at most FILTERED_COUNT_CAP rows (an index scan that stops
  there), so a broad filter costs a bounded amount; pages past the cap are reached by
  narrowing the filter instead.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.utils.functional import cached_property

from monitoring.repositories import HealthRepository

EXACT_COUNT_BELOW = 10_000
FILTERED_COUNT_CAP = 10_000


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not queryset.query.where:
            estimate = HealthRepository().table_row_estimate(queryset.model._meta.db_table)
            if estimate is not None and estimate >= EXACT_COUNT_BELOW:
                return estimate
            return queryset.count()
        return queryset[:FILTERED_COUNT_CAP].count()
