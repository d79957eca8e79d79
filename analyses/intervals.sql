-- intervals: reusable interval macros (union, intersection, covered length), written once.
-- Depends on: (nothing)
--
-- Every macro works on tables with the columns
--   run_id VARCHAR, rank INTEGER, grp BIGINT (a window: -1 = whole trace, else a profiler step),
--   s BIGINT (start, ns), e BIGINT (end, ns; e >= s)
-- and partitions by (run_id, rank, grp). Tables are passed by name (query_table).
--
-- merge_intervals(tbl) → run_id, rank, grp, s, e : the union of tbl's intervals as disjoint
--   islands (touching intervals merge). Classic gaps-and-islands: an island starts where s is
--   past every earlier end.
CREATE OR REPLACE MACRO merge_intervals(tbl) AS TABLE
WITH o AS (
    SELECT run_id, rank, grp, s, e,
           max(e) OVER (PARTITION BY run_id, rank, grp ORDER BY s, e
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM query_table(tbl)
    WHERE e >= s
),
g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
                OVER (PARTITION BY run_id, rank, grp ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
    FROM o
)
SELECT run_id, rank, grp, min(s) AS s, max(e) AS e
FROM g GROUP BY run_id, rank, grp, island;

-- intersect_islands(a, b) → run_id, rank, grp, s, e : the pieces of a ∩ b, where a and b are each
--   a set of DISJOINT islands (outputs of merge_intervals). A sweep over the boundaries: +1/−1
--   coverage counters per set; a segment between consecutive boundaries is in the intersection
--   when both counters are positive. O(n log n), no range join.
CREATE OR REPLACE MACRO intersect_islands(a, b) AS TABLE
WITH pts AS (
    SELECT run_id, rank, grp, s AS t, 1 AS da, 0 AS db FROM query_table(a)
    UNION ALL SELECT run_id, rank, grp, e, -1, 0 FROM query_table(a)
    UNION ALL SELECT run_id, rank, grp, s, 0, 1 FROM query_table(b)
    UNION ALL SELECT run_id, rank, grp, e, 0, -1 FROM query_table(b)
),
agg AS (
    SELECT run_id, rank, grp, t, sum(da) AS da, sum(db) AS db FROM pts GROUP BY run_id, rank, grp, t
),
sweep AS (
    SELECT run_id, rank, grp, t,
           sum(da) OVER w AS ca, sum(db) OVER w AS cb,
           lead(t) OVER (PARTITION BY run_id, rank, grp ORDER BY t) AS t_next
    FROM agg
    WINDOW w AS (PARTITION BY run_id, rank, grp ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT run_id, rank, grp, t AS s, t_next AS e
FROM sweep WHERE ca > 0 AND cb > 0 AND t_next > t;

-- island_prefix(tbl) → run_id, rank, grp, s, e, cum_before : islands with the total island length
--   before each one; with an ASOF join this gives the covered length up to any time t:
--   C(t) = cum_before + least(t, e) − s for the last island with s <= t (0 if none).
CREATE OR REPLACE MACRO island_prefix(tbl) AS TABLE
SELECT run_id, rank, grp, s, e,
       coalesce(sum(e - s) OVER (PARTITION BY run_id, rank, grp ORDER BY s
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS cum_before
FROM query_table(tbl);

-- union_lengths(tbl) → run_id, rank, grp, a_ns, b_ns, ab_ns : the lengths |∪A|, |∪B| and |∪A ∩ ∪B|
--   (BIGINT, ns) per window, for a table with the columns above plus in_a BOOLEAN (true: the
--   interval is in set A, false: in set B). Same numbers as summing e − s over merge_intervals /
--   intersect_islands, without building islands: sorted by (s, e), an interval adds to its set's
--   union the part of it past the latest end before it, greatest(e − greatest(s, prev_end), 0);
--   and |A ∩ B| = |A| + |B| − |A ∪ B|. One sort and three running maxima. Only windows holding
--   an interval (with e >= s) appear.
CREATE OR REPLACE MACRO union_lengths(tbl) AS TABLE
WITH w AS (
    SELECT run_id, rank, grp, s, e, in_a,
           max(e) OVER win AS prev_ab,
           max(e) FILTER (WHERE in_a) OVER win AS prev_a,
           max(e) FILTER (WHERE NOT in_a) OVER win AS prev_b
    FROM query_table(tbl)
    WHERE e >= s
    WINDOW win AS (PARTITION BY run_id, rank, grp ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
l AS (
    SELECT run_id, rank, grp,
           sum(CASE WHEN in_a THEN greatest(e - greatest(s, coalesce(prev_a, s)), 0) ELSE 0 END)::BIGINT AS a_ns,
           sum(CASE WHEN in_a THEN 0 ELSE greatest(e - greatest(s, coalesce(prev_b, s)), 0) END)::BIGINT AS b_ns,
           sum(greatest(e - greatest(s, coalesce(prev_ab, s)), 0))::BIGINT AS all_ns
    FROM w GROUP BY run_id, rank, grp
)
SELECT run_id, rank, grp, a_ns, b_ns, a_ns + b_ns - all_ns AS ab_ns FROM l;
