"""An admin paginator whose every page costs the same whatever the size of the table.

Django's admin counts the rows of the list it shows on every page load, and reads a page
with OFFSET, which reads every row before it. On a table of millions of rows both grow with
the history. This paginator:
- for an unfiltered list, uses the planner's estimate (pg_class.reltuples), once the table is
  big enough for the estimate to matter; below that the exact count is cheap;
- for a filtered list, counts at most LIST_DEPTH rows (an index scan that stops there);
- offers and serves pages only down to the LIST_DEPTH-th row of a list, filtered or not: the
  last page of an estimated million, one click away in the page links, would read the whole
  table (1.1 s with 1,000,000 rows). A page past that is refused as any
  page past the end is (the admin shows the first page). Older rows are reached by narrowing
  the list (a date, a status, a client), as an operator looking for them does.
"""

from __future__ import annotations

import math

from django.core.paginator import Paginator
from django.utils.functional import cached_property

from monitoring.repositories import table_row_estimate

EXACT_COUNT_BELOW = 10_000
LIST_DEPTH = 10_000


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not queryset.query.where:
            estimate = table_row_estimate(queryset.model._meta.db_table)
            if estimate is not None and estimate >= EXACT_COUNT_BELOW:
                return estimate
            return queryset.count()
        return queryset[:LIST_DEPTH].count()

    @property
    def num_pages(self) -> int:
        return min(super().num_pages, math.ceil(LIST_DEPTH / self.per_page))
