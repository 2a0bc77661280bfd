// The peer's worker: what a Node team would put behind the start. A BullMQ
// worker takes the run's job, validates the submission against the
// workflow's JSON Schema with ajv, and writes the result to the run row in
// one statement: status, started_at, finished_at, and the findings: in the
// run's findings column (JSON) where the schema has one, else one row each
// in the findings table, in the same statement. It does not
// evaluate the workflow's CEL assertions (valruns does): it does less, on
// purpose, like the rest of the peer.
//
// `node worker.js` runs it as a process of its own; server.js runs it in its
// own process when PEER_WORKER=1.
//
// Environment:
//   DATABASE_URL, REDIS_URL       as server.js
//   PEER_WORKER_CONCURRENCY       jobs at once (default 10, valruns' WORKER_CONCURRENCY default)
//   PG_POOL_MAX                   pg pool size (default 10)
//   HEALTH_PORT, HOST             `node worker.js` answers GET /healthz there once ready
'use strict';

const http = require('http');
const { Worker } = require('bullmq');
const IORedis = require('ioredis');
const Ajv = require('ajv');
const { Pool } = require('pg');

const QUEUE = 'runs';

// finishRunColumn writes the findings into the run's own column.
const finishRunColumn = `UPDATE validation_runs
   SET status = $2, attempts = attempts + 1, started_at = $3, finished_at = now(), findings = $4::json
 WHERE id = $1 AND status IN ('queued', 'running')`;

// finishRunRows writes one findings row each (schemas before valruns' 0004).
const finishRunRows = `WITH r AS (
  UPDATE validation_runs
     SET status = $2, attempts = attempts + 1, started_at = $3, finished_at = now()
   WHERE id = $1 AND status IN ('queued', 'running')
  RETURNING id)
INSERT INTO findings (run_id, position, step, severity, path, message)
SELECT r.id, f.position, f.step, f.severity, f.path, f.message
  FROM r, jsonb_to_recordset($4::jsonb) AS f(position int, step text, severity text, path text, message text)`;

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`peer worker: ${name} is required`);
    process.exit(2);
  }
  return v;
}

// startWorker starts the BullMQ worker; it resolves to { worker, close }.
async function startWorker() {
  const pool = new Pool({ connectionString: need('DATABASE_URL'), max: Number(process.env.PG_POOL_MAX || 10) });
  const connection = new IORedis(need('REDIS_URL'), { maxRetriesPerRequest: null });
  const ajv = new Ajv({ allErrors: true, strict: false });
  const hasColumn = await pool.query(`SELECT EXISTS (SELECT 1 FROM information_schema.columns
    WHERE table_name = 'validation_runs' AND column_name = 'findings') AS yes`);
  const finishRun = hasColumn.rows[0].yes ? finishRunColumn : finishRunRows;
  const validators = new Map(); // workflow id -> Promise of a compiled schema (or null)

  const validatorFor = (workflowID) => {
    let v = validators.get(workflowID);
    if (!v) {
      v = pool.query('SELECT schema FROM workflows WHERE id = $1', [workflowID]).then((r) => {
        const schema = r.rows[0] && r.rows[0].schema;
        return schema ? ajv.compile(schema) : null;
      });
      v.catch(() => validators.delete(workflowID));
      validators.set(workflowID, v);
    }
    return v;
  };

  const worker = new Worker(
    QUEUE,
    async (job) => {
      const startedAt = new Date();
      const { runId, workflowId, submission } = job.data;
      const validate = await validatorFor(workflowId);
      const findings = [];
      if (validate && !validate(submission)) {
        for (const [i, e] of validate.errors.entries()) {
          findings.push({ position: i, step: 'schema', severity: 'error', path: e.instancePath || '', message: e.message || 'invalid' });
        }
      }
      const status = findings.length ? 'failed' : 'passed';
      await pool.query(finishRun, [runId, status, startedAt, JSON.stringify(findings)]);
      return status;
    },
    { connection, concurrency: Number(process.env.PEER_WORKER_CONCURRENCY || 10) },
  );
  worker.on('failed', (job, err) => console.error(`peer worker: job ${job && job.id} failed: ${err.message}`));
  await worker.waitUntilReady();
  const close = () => worker.close().then(() => Promise.all([pool.end(), connection.quit()]));
  return { worker, close };
}

module.exports = { startWorker, QUEUE };

if (require.main === module) {
  startWorker()
    .then(({ close }) => {
      const host = process.env.HOST || '127.0.0.1';
      const server = http.createServer((req, res) => {
        res.writeHead(req.url === '/healthz' ? 200 : 404, { 'Content-Type': 'application/json' });
        res.end('{"status":"ok"}');
      });
      server.listen(Number(process.env.HEALTH_PORT || 18082), host, () => console.log('peer worker ready'));
      const stop = () => server.close(() => close().finally(() => process.exit(0)));
      process.on('SIGTERM', stop);
      process.on('SIGINT', stop);
    })
    .catch((err) => {
      console.error('peer worker:', err.message);
      process.exit(1);
    });
}
