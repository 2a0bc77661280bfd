-- +goose Up
-- +goose NO TRANSACTION
-- A run's final write becomes a HOT update (issue 15: less WAL per run).
--
-- The sweeper found the runs that are not final through a partial index on
-- validation_runs (status, created_at, id) WHERE status is queued or
-- running. Because status was in an index, no update that changed it could
-- be HOT: every run's final write (and a claim) wrote its row on a new
-- page as often as not, plus a new entry in each of the table's three
-- other indexes (the primary key and both list indexes), about 340 bytes of
-- WAL per run. Now the runs not final are listed in unfinished_runs, one
-- narrow row each, inserted in the start's statement and deleted in the
-- statement that ends the run; no index of validation_runs holds a column
-- that a claim or an end changes, so both are HOT whenever the page has
-- room, and the fillfactor leaves room: a page full of new runs would push
-- each finished version onto another page. Measured (2,000 runs started,
-- then executed): fillfactor 90, 75, 70 and 60 made 57%, 75%, 83% and 94%
-- of the ends HOT; 70 costs the runs' heap about 1.4x its packed size.
--
-- No foreign key to validation_runs: its check would lock the new run's
-- row (a WAL record per start). The sweeper deletes a row whose run is
-- final or gone.
--
-- Outside a transaction, so that the old index is dropped CONCURRENTLY;
-- each statement may be run again. Starts sent by a valruns older than
-- this migration do not list their runs here: upgrade every API replica
-- right after migrating, then run the INSERT below once more.
CREATE TABLE IF NOT EXISTS unfinished_runs (
    id uuid PRIMARY KEY
);
INSERT INTO unfinished_runs (id)
SELECT id FROM validation_runs WHERE status IN ('queued', 'running')
ON CONFLICT DO NOTHING;
ALTER TABLE validation_runs SET (fillfactor = 70);
DROP INDEX CONCURRENTLY IF EXISTS validation_runs_unfinished_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS validation_runs_unfinished_idx ON validation_runs (status, created_at, id)
    WHERE status IN ('queued', 'running');
ALTER TABLE validation_runs RESET (fillfactor);
DROP TABLE IF EXISTS unfinished_runs;
