-- intervals: reusable interval macros (union, intersection, covered length), written once.
-- Reads: (nothing)
--
-- Every macro works on tables with the columns
--   run_id VARCHAR, rank INTEGER, grp BIGINT (a window: -1 = whole trace, else a profiler step),
--   s BIGINT (start, ns), e BIGINT (end, ns; e >= s)
-- and partitions by (run_id, rank, grp). Tables are passed by name (query_table).
--
-- merge_intervals(tbl) → run_id, rank, grp, s, e : the union of tbl's intervals as disjoint
--   islands (touching intervals merge). Classic gaps-and-islands: an island starts where s is
--   past every earlier end. Intervals with the same start are first merged into one (the longest),
--   so that the two window passes below see distinct starts: with ties, each pass may order the
--   tied rows its own way, and an island could start on one row and be numbered from another.
CREATE OR REPLACE MACRO merge_intervals(tbl) AS TABLE
WITH d AS (
    SELECT run_id, rank, grp, s, max(e) AS e
    FROM query_table(tbl)
    WHERE e >= s
    GROUP BY run_id, rank, grp, s
),
o AS (
    SELECT run_id, rank, grp, s, e,
           max(e) OVER (PARTITION BY run_id, rank, grp ORDER BY s
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM d
),
g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
                OVER (PARTITION BY run_id, rank, grp ORDER BY s ROWS UNBOUNDED PRECEDING) AS island
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
