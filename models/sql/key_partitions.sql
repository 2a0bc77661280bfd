-- key_partitions.sql: the day partitions of idempotency_keys
-- (KeyStore.Partitions), found by their names (idempotency_keys_pYYYYMMDD,
-- made by idempotency_key_partitions, migration 0012), attached or not: a
-- cleanup that stopped between a partition's detach and its drop leaves it
-- detached, or pending detach.
--
-- No parameters. Returns per partition, oldest first: its name, its range
-- of expires_at [lower, upper) (UTC days), whether it is attached, whether a
-- DETACH ... CONCURRENTLY of it was interrupted, whether its whole range
-- has expired by the database's clock, whether its range starts after now
-- (made ahead), and the planner's estimate of its rows (-1: never vacuumed
-- or analysed).
SELECT p.relname, p.lower, p.upper, p.attached, p.pending, p.upper <= now(), p.lower > now(), p.reltuples
FROM (
	SELECT c.relname, CAST(d.day AS timestamp) AT TIME ZONE 'UTC' AS lower,
		CAST(d.day + 1 AS timestamp) AT TIME ZONE 'UTC' AS upper,
		i.inhrelid IS NOT NULL AS attached, coalesce(i.inhdetachpending, false) AS pending,
		CAST(c.reltuples AS bigint) AS reltuples
	FROM pg_class c
	CROSS JOIN LATERAL (SELECT to_date(substr(c.relname, 19), 'YYYYMMDD') AS day) d
	LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = CAST('idempotency_keys' AS regclass)
	WHERE c.relkind = 'r' AND c.relnamespace = to_regnamespace(current_schema())
	  AND c.relname ~ '^idempotency_keys_p[0-9]{8}$'
) p
ORDER BY p.lower
