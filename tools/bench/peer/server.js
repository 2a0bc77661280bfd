// The peer valruns is benchmarked against: what a team would otherwise pick
// for an idempotent "start a run" endpoint in Node.js. Express, the
// express-idempotency middleware storing responses in Redis through
// express-idempotency-redis-adapter, and pg inserting the same run row into
// the same validation_runs table, with one INSERT per start; after the
// INSERT, the run's job is added to a BullMQ queue on the same Redis
// (worker.js executes it). No auth, no quota, no audit, no outbox (a crash
// between the INSERT and the enqueue leaves a run that never runs): it does
// less than valruns, on purpose. With PEER_ENQUEUE=0 it does less still:
// no enqueue, the INSERT alone (issue 48's peer for starts).
//
// GET /api/runs/:id/ reads the run; with `Prefer: wait=N` (as valruns' long
// poll) it first waits up to N seconds for the run's job with BullMQ's
// QueueEvents and job.waitUntilFinished, as a Node team would.
//
// Environment (set by the bench harness):
//   PORT, HOST        where to listen (default 127.0.0.1:18081)
//   DATABASE_URL      PostgreSQL (the benchmark's database)
//   REDIS_URL         Redis for the idempotency adapter (a private server or DB)
//   ORG_ID            the organisation the runs belong to
//   PG_POOL_MAX       pg pool size (default 20, like valruns' pool)
//   PEER_WORKER=1     also run the BullMQ worker (worker.js) in this process
//   PEER_ENQUEUE=0    add no BullMQ job after the INSERT (default: add one)
'use strict';

const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');
const RedisAdapter = require('express-idempotency-redis-adapter').default;
const { Pool } = require('pg');
const { Queue, QueueEvents } = require('bullmq');
const IORedis = require('ioredis');
const { startWorker, QUEUE } = require('./worker');

const need = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`peer: ${name} is required`);
    process.exit(2);
  }
  return v;
};

const port = Number(process.env.PORT || 18081);
const host = process.env.HOST || '127.0.0.1';
const orgID = need('ORG_ID');
const enqueue = process.env.PEER_ENQUEUE !== '0';
const pool = new Pool({
  connectionString: need('DATABASE_URL'),
  max: Number(process.env.PG_POOL_MAX || 20),
});
const adapter = new RedisAdapter({ connectionConfig: { url: need('REDIS_URL') } });
const queue = new Queue(QUEUE, {
  connection: new IORedis(need('REDIS_URL'), { maxRetriesPerRequest: null }),
  defaultJobOptions: { removeOnComplete: true, removeOnFail: 1000, attempts: 3, backoff: { type: 'exponential', delay: 1000 } },
});

// Every waiting read listens for the queue's 'closing' (waitUntilFinished):
// as many listeners as reads at once, not a leak.
queue.setMaxListeners(0);
const queueEvents = new QueueEvents(QUEUE, { connection: new IORedis(need('REDIS_URL'), { maxRetriesPerRequest: null }) });

const readRun = `SELECT id, workflow_id, status, submission, metadata, attempts, created_at, started_at, finished_at
FROM validation_runs WHERE id = $1`;

const insertRun = `INSERT INTO validation_runs (org_id, workflow_id, submission, metadata)
VALUES ($1, $2, $3, $4)
RETURNING id, workflow_id, status, submission, metadata, attempts, created_at`;

const app = express();
app.disable('x-powered-by');
app.use(express.json({ limit: '1mb' }));

app.get('/healthz', (req, res) => res.json({ status: 'ok' }));

app.post('/api/workflows/:id/start', idempotency({ dataAdapter: adapter }), async (req, res, next) => {
  const svc = getSharedIdempotencyService();
  if (svc.isHit(req)) {
    return; // the middleware answered: a replay, or 409/417 for a key in use
  }
  const body = req.body || {};
  if (body.submission === undefined) {
    res.status(400).json({ error: 'submission is required' });
    return;
  }
  try {
    const r = await pool.query(insertRun, [
      orgID,
      req.params.id,
      JSON.stringify(body.submission),
      JSON.stringify(body.metadata || {}),
    ]);
    const run = r.rows[0];
    if (enqueue) {
      await queue.add('run', { runId: run.id, workflowId: run.workflow_id, submission: body.submission }, { jobId: run.id });
    }
    res.status(201).location(`/api/runs/${run.id}/`).json(run);
  } catch (err) {
    await svc.reportError(req).catch(() => {});
    next(err);
  }
});

app.get('/api/runs/:id', async (req, res, next) => {
  const wait = /(?:^|[,;\s])wait=(\d+)/.exec(req.get('Prefer') || '');
  try {
    if (wait) {
      // A job already finished and removed (removeOnComplete), or one that
      // failed or timed out, rejects: the row says how it is either way.
      const job = await queue.getJob(req.params.id);
      if (job) {
        await job.waitUntilFinished(queueEvents, Math.min(Number(wait[1]), 30) * 1000).catch(() => {});
      }
    }
    const r = await pool.query(readRun, [req.params.id]);
    if (r.rows.length === 0) {
      res.status(404).json({ error: 'no such run' });
      return;
    }
    res.json(r.rows[0]);
  } catch (err) {
    next(err);
  }
});

app.use((err, req, res, next) => {
  if (res.headersSent) {
    return next(err);
  }
  const status = res.statusCode >= 400 ? res.statusCode : 500;
  res.status(status).json({ error: err.message });
});

Promise.all([adapter.connect(), queue.waitUntilReady(), queueEvents.waitUntilReady(), process.env.PEER_WORKER === '1' ? startWorker() : null])
  .then(([, , , inline]) => {
    const server = app.listen(port, host, () => console.log(`peer listening on ${host}:${port}`));
    server.keepAliveTimeout = 120000;
    const closeAll = () =>
      Promise.all([pool.end(), adapter.disconnect(), queue.close(), queueEvents.close(), inline ? inline.close() : null]);
    const stop = () => server.close(() => closeAll().finally(() => process.exit(0)));
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  })
  .catch((err) => {
    console.error('peer: cannot connect to Redis:', err.message);
    process.exit(1);
  });
