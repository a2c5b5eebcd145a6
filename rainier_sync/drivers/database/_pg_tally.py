"""PostgreSQL's settle of many tally members, and its add of many fields: one
statement each, so one round trip.

Its steps run in an order the statement's own data flow forces: first the
members are inserted (in key and member order; the new ones come back), then
each tally's ``pending`` row is changed, and only then its other rows. Every
change of a tally's rows takes ``pending`` first (see ``_lock_rows``), so two
settles, or a settle and an add, wait for each other instead of deadlocking.
"""

from __future__ import annotations

from typing import Any, Sequence

from ._schema import TALLIES, TALLY_MEMBERS

__all__ = ["SETTLE", "ADD", "settle_params", "read_settled"]

SETTLE = f"""WITH input (tally_key, member, field, until) AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[])),
keys (tally_key, until) AS (SELECT tally_key, max(until) FROM input GROUP BY tally_key),
ins AS (
    INSERT INTO {TALLY_MEMBERS} (tally_key, member, expires_at)
    SELECT tally_key, member, until FROM input ORDER BY tally_key, member
    ON CONFLICT DO NOTHING RETURNING tally_key, member),
new AS (SELECT i.tally_key, i.field FROM input i JOIN ins USING (tally_key, member)),
pend AS (
    INSERT INTO {TALLIES} (tally_key, field, n, expires_at)
    SELECT k.tally_key, 'pending', -(SELECT count(*) FROM new WHERE new.tally_key = k.tally_key), k.until
    FROM keys k ORDER BY k.tally_key
    ON CONFLICT (tally_key, field) DO UPDATE SET n = {TALLIES}.n + excluded.n, expires_at = excluded.expires_at
    RETURNING tally_key, field, n),
flds AS (
    INSERT INTO {TALLIES} (tally_key, field, n, expires_at)
    SELECT new.tally_key, new.field, count(*), max(k.until) FROM new JOIN keys k USING (tally_key)
    WHERE (SELECT count(*) FROM pend) >= 0 AND new.field <> 'pending'
    GROUP BY new.tally_key, new.field ORDER BY 1, 2
    ON CONFLICT (tally_key, field) DO UPDATE SET n = {TALLIES}.n + excluded.n, expires_at = excluded.expires_at
    RETURNING tally_key, field, n),
touched AS (
    UPDATE {TALLIES} t SET expires_at = k.until FROM keys k
    WHERE t.tally_key = k.tally_key AND t.field <> 'pending' AND (SELECT count(*) FROM pend) >= 0
    AND NOT EXISTS (SELECT 1 FROM new WHERE new.tally_key = t.tally_key AND new.field = t.field)
    RETURNING t.tally_key, t.field, t.n)
SELECT 'n', tally_key, field, n FROM pend
UNION ALL SELECT 'n', tally_key, field, n FROM flds
UNION ALL SELECT 'n', tally_key, field, n FROM touched
UNION ALL SELECT 'm', tally_key, member, 0 FROM ins"""


#: Adds ``n`` to each field of one tally and renews every row's expiry; returns
#: all its rows. Run after the tally's rows are locked (``_lock_rows``), so its
#: snapshot sees every row a change that held them committed.
ADD = f"""WITH input (tally_key, field, n, until) AS (
    SELECT %s::text, field, n, %s::float8 FROM unnest(%s::text[], %s::bigint[]) AS u (field, n)),
added AS (
    INSERT INTO {TALLIES} (tally_key, field, n, expires_at)
    SELECT tally_key, field, n, until FROM input ORDER BY field <> 'pending', field
    ON CONFLICT (tally_key, field) DO UPDATE SET n = {TALLIES}.n + excluded.n, expires_at = excluded.expires_at
    RETURNING field, n),
touched AS (
    UPDATE {TALLIES} t SET expires_at = i.until FROM (SELECT tally_key, until FROM input LIMIT 1) i
    WHERE t.tally_key = i.tally_key AND t.field NOT IN (SELECT field FROM input)
    RETURNING t.field, t.n)
SELECT field, n FROM added UNION ALL SELECT field, n FROM touched"""


def settle_params(items: Sequence[tuple[str, str, str, float]], now: float) -> list[Any]:
    """The statement's parameters: each ``(key, member)`` once (the first item
    that names it), kept ``ttl`` seconds from ``now``."""
    seen: set[tuple[str, str]] = set()
    keys: list[str] = []
    members: list[str] = []
    fields: list[str] = []
    untils: list[float] = []
    for key, member, field, ttl in items:
        if (key, member) in seen:
            continue
        seen.add((key, member))
        keys.append(key)
        members.append(member)
        fields.append(field)
        untils.append(now + float(ttl))
    return [keys, members, fields, untils]


def read_settled(
    rows: Sequence[tuple[Any, ...]], items: Sequence[tuple[str, str, str, float]]
) -> list[tuple[dict[str, int], bool]]:
    """Each item's key's counts, and whether its member was new (the first time
    it is named only)."""
    counts: dict[str, dict[str, int]] = {}
    inserted: set[tuple[str, str]] = set()
    for kind, key, name, n in rows:
        if kind == "n":
            counts.setdefault(str(key), {})[str(name)] = int(n)
        else:
            inserted.add((str(key), str(name)))
    out: list[tuple[dict[str, int], bool]] = []
    for key, member, _, _ in items:
        out.append((dict(counts.get(key, {})), (key, member) in inserted))
        inserted.discard((key, member))
    return out
