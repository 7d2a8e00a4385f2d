"""The runs table's filter menus: the projects and tags the runs carry."""

from typing import Any

from sqlalchemy import distinct, func, select, true
from sqlalchemy.orm import Session

from packscope.backend.reads.runs_list import tag_elements
from packscope.backend.store.models import Run


def facets(session: Session, archived: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The distinct projects and tags of the runs (archived ones only when asked), each with how
    many runs carry it, by value: what the runs table's filter menus offer."""
    dialect = session.get_bind().dialect.name
    shown = [] if archived else [Run.archived.is_(False)]
    projects = session.execute(
        select(Run.project, func.count())
        .where(Run.project.is_not(None), *shown)
        .group_by(Run.project)
        .order_by(Run.project)
    )
    tags = tag_elements(dialect)
    tagged = session.execute(
        select(tags.c.value, func.count(distinct(Run.id)))
        .select_from(Run)
        .join(tags, true())
        .where(*shown)
        .group_by(tags.c.value)
        .order_by(tags.c.value)
    )
    return {
        "projects": [{"value": value, "runs": int(n)} for value, n in projects],
        "tags": [{"value": value, "runs": int(n)} for value, n in tagged],
    }
