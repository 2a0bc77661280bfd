-- The peer's start (tools/bench/peer/server.js, insertRun): its one
-- INSERT, committed on its own. The harness runs it with pgbench -M prepared
-- -D org=UUID -D wf=UUID (the bench organisation and its workflow).
INSERT INTO validation_runs (org_id, workflow_id, submission, metadata)
VALUES (:org, :wf, '{"customer":"ACME","total":42,"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}', '{"source":"bench"}')
RETURNING id, workflow_id, status, submission, metadata, attempts, created_at;
