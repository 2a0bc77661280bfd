package main

// The backlog drain: runs queued by the API with no worker running, then a
// `valruns worker` alone executes them all. Runs per second and CPU per run
// (the worker's, and PostgreSQL's backends' for the worker), for each
// WORKER_CONCURRENCY of the sweep, every point on a copy of the same queue
// (the database cloned, Redis restored key by key).

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

type drainPoint struct {
	Concurrency int
	Runs        int           // runs executed
	Elapsed     time.Duration // from the worker's start to the last finished_at
	WorkerCPU   time.Duration // per run
	PGCPU       time.Duration // per run: the worker's PostgreSQL backends
	Failed      string
}

func (d drainPoint) RunsPerSec() float64 { return perSec(d.Runs, d.Elapsed) }

type drainResult struct {
	Side   string
	Queued int
	Build  time.Duration // queueing the runs through the API
	Points []drainPoint
	Failed string
}

// measureDrain queues runs new-key runs on side s through `serve`, then
// drains a copy of that queue with each worker concurrency.
func (e *env) measureDrain(ctx context.Context, s *side, runs int, concurrencies []int) (res drainResult) {
	res.Side = s.Name
	fail := func(err error) drainResult {
		res.Failed = err.Error()
		say("drain %s failed: %v", s.Name, err)
		return res
	}
	qdb, err := e.freshFrom(ctx, s.tmpl)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, qdb) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}
	srv, base, err := e.startServerBin(ctx, s.bin, e.dbURL(qdb), false)
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	err = startMany(ctx, base+s.org.startPath(), s.org.Token, []byte(startBody), runs, 32)
	res.Build = time.Since(t0)
	srv.Stop(20 * time.Second)
	if err != nil {
		return fail(fmt.Errorf("queueing %d runs: %w", runs, err))
	}
	snap, err := dumpRedis(ctx, e.rdb)
	if err != nil {
		return fail(err)
	}
	say("drain %s: %d runs queued in %.1f s (%d Redis keys kept for each point)", s.Name, runs, res.Build.Seconds(), len(snap))
	for _, c := range concurrencies {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		p := e.drainOnce(ctx, s, qdb, snap, c)
		res.Points = append(res.Points, p)
		res.Queued = max(res.Queued, p.Runs)
		if p.Failed != "" {
			say("drain %s c=%d failed: %s", s.Name, c, p.Failed)
		} else {
			say("drain %s WORKER_CONCURRENCY=%-3d %6.0f runs/s  worker %s ms CPU/run  PostgreSQL %s ms CPU/run",
				s.Name, c, p.RunsPerSec(), ms3(p.WorkerCPU), ms3(p.PGCPU))
		}
	}
	return res
}

func (e *env) drainOnce(ctx context.Context, s *side, qdb string, snap []redisKey, concurrency int) (p drainPoint) {
	p.Concurrency = concurrency
	fail := func(err error) drainPoint { p.Failed = err.Error(); return p }
	db, err := e.freshFrom(ctx, qdb)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}
	if err := restoreRedis(ctx, e.rdb, snap); err != nil {
		return fail(err)
	}
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	var pending int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs WHERE finished_at IS NULL`).Scan(&pending); err != nil {
		return fail(err)
	}
	var began time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&began); err != nil {
		return fail(err)
	}
	w, err := e.startWorkerBin(ctx, s.bin, e.dbURL(db), fmt.Sprintf("WORKER_CONCURRENCY=%d", concurrency))
	if err != nil {
		return fail(err)
	}
	defer w.Stop(20 * time.Second)
	timeout := 2*time.Minute + time.Duration(pending)*20*time.Millisecond // 50 runs/s at worst
	if _, err := waitAllFinal(ctx, conn, timeout); err != nil {
		return fail(err)
	}
	wcpu, _ := cpuTime(w.Pid())
	pgcpu, err := backendsCPU(ctx, conn, db)
	if err != nil {
		return fail(err)
	}
	var last time.Time
	if err := conn.QueryRow(ctx, `SELECT max(finished_at) FROM validation_runs`).Scan(&last); err != nil {
		return fail(err)
	}
	p.Runs, p.Elapsed = pending, last.Sub(began)
	if pending > 0 {
		p.WorkerCPU = wcpu / time.Duration(pending)
		p.PGCPU = pgcpu / time.Duration(pending)
	}
	return p
}

// backendsCPU sums the CPU time of the backends on db other than this
// connection's: they were all started for the measured process (read from
// /proc, so PostgreSQL must run on this machine; 0 when it cannot be read).
func backendsCPU(ctx context.Context, conn *pgx.Conn, db string) (time.Duration, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, pid := range pids {
		if c, err := cpuTime(pid); err == nil {
			sum += c
		}
	}
	return sum, nil
}

// redisKey is one key of a Redis snapshot.
type redisKey struct {
	Key   string
	TTL   time.Duration
	Value string // DUMP's serialisation
}

// dumpRedis keeps every key of the database.
func dumpRedis(ctx context.Context, rdb *redis.Client) ([]redisKey, error) {
	var keys []string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	var out []redisKey
	for i := 0; i < len(keys); i += 1000 {
		batch := keys[i:min(i+1000, len(keys))]
		pipe := rdb.Pipeline()
		dumps := make([]*redis.StringCmd, len(batch))
		ttls := make([]*redis.DurationCmd, len(batch))
		for j, k := range batch {
			dumps[j], ttls[j] = pipe.Dump(ctx, k), pipe.PTTL(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, err
		}
		for j, k := range batch {
			v, err := dumps[j].Result()
			if err == redis.Nil {
				continue // gone meanwhile
			}
			if err != nil {
				return nil, err
			}
			out = append(out, redisKey{Key: k, TTL: max(0, ttls[j].Val()), Value: v})
		}
	}
	return out, nil
}

// restoreRedis puts a snapshot back.
func restoreRedis(ctx context.Context, rdb *redis.Client, snap []redisKey) error {
	for i := 0; i < len(snap); i += 1000 {
		pipe := rdb.Pipeline()
		for _, k := range snap[i:min(i+1000, len(snap))] {
			pipe.RestoreReplace(ctx, k.Key, k.TTL, k.Value)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}
