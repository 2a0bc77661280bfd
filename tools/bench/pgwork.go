package main

// PostgreSQL's work per run, for a start and for a worker's execution of a
// run, separately: the WAL they write, the rows and index entries, the
// statements and round trips. A phase runs with its process behind the
// capture proxy (statements, round trips), between two WAL positions
// (bytes, records, full-page images) and two readings of
// pg_stat_user_tables (rows by table), on a database of its own.
//
// The PostgreSQL server is shared (other databases write WAL too), so the
// WAL figures are this database's own records, read back with
// pg_walinspect (PostgreSQL 15+): every record on one of its relations,
// plus the records of the same transactions (their commits). The plain
// WAL position difference (pg_current_wal_flush_lsn()), every database included, is kept beside
// them; when pg_walinspect is missing, it is all there is.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// walKind is WAL of one resource manager and record type.
type walKind struct {
	Records, Bytes, FPIs, FPIBytes int64
}

// tableWork is one table's rows written in a phase.
type tableWork struct {
	Table                 string
	Ins, Upd, HotUpd, Del int64
}

// phaseWork is PostgreSQL's work in one phase.
type phaseWork struct {
	Runs       int   // what the phase did: runs started, or runs executed
	ClusterWAL int64 // WAL position difference, every database included
	// This database's WAL by "rmgr/type" (nil without pg_walinspect).
	WAL        map[string]walKind
	Tables     []tableWork
	Stmts      int
	RoundTrips int
	// TopStmts: the statements sent most, normalised, with their count.
	TopStmts []stmtCount
	Elapsed  time.Duration
}

type stmtCount struct {
	SQL string
	N   int
}

// pgWorkResult is one side's work per run.
type pgWorkResult struct {
	Side        string
	Start, Exec phaseWork
	Walinspect  bool
	Failed      string
}

func (p phaseWork) per(n int64) float64 {
	if p.Runs == 0 {
		return 0
	}
	return float64(n) / float64(p.Runs)
}

// sum adds the WAL kinds whose "rmgr/type" key f accepts.
func (p phaseWork) sum(f func(rmgr, typ string) bool) (k walKind) {
	for key, v := range p.WAL {
		rmgr, typ, _ := strings.Cut(key, "/")
		if f(rmgr, typ) {
			k.Records += v.Records
			k.Bytes += v.Bytes
			k.FPIs += v.FPIs
			k.FPIBytes += v.FPIBytes
		}
	}
	return k
}

func (p phaseWork) all() walKind { return p.sum(func(string, string) bool { return true }) }

// HeapWrites counts heap tuples inserted, updated, deleted or locked (records).
func (p phaseWork) heap(types ...string) int64 {
	return p.sum(func(rmgr, typ string) bool {
		return (rmgr == "Heap" || rmgr == "Heap2") && slices.Contains(types, typ)
	}).Records
}

// IndexInserts counts B-tree leaf insertions: index entries written.
func (p phaseWork) indexInserts() int64 {
	return p.sum(func(rmgr, typ string) bool {
		return rmgr == "Btree" && (typ == "INSERT_LEAF" || typ == "INSERT_POST")
	}).Records
}

func (p phaseWork) commits() int64 {
	return p.sum(func(rmgr, typ string) bool { return rmgr == "Transaction" && strings.HasPrefix(typ, "COMMIT") }).Records
}

// rows sums the tables' rows written: inserted, updated, deleted.
func (p phaseWork) rows() (ins, upd, hot, del int64) {
	for _, t := range p.Tables {
		ins, upd, hot, del = ins+t.Ins, upd+t.Upd, hot+t.HotUpd, del+t.Del
	}
	return
}

// walKinds lists this database's WAL per run by "rmgr/type", most bytes
// first, records then bytes: "Heap/INSERT 2.00, 531 B", ...
func (p phaseWork) walKinds() string {
	keys := slices.Collect(maps.Keys(p.WAL))
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(p.WAL[b].Bytes, p.WAL[a].Bytes), strings.Compare(a, b))
	})
	var out []string
	for _, k := range keys {
		v := p.WAL[k]
		out = append(out, fmt.Sprintf("%s %.2f, %.0f B", k, p.per(v.Records), p.per(v.Bytes)))
	}
	return strings.Join(out, ", ")
}

// walBytes is this database's WAL when known, else the cluster's.
func (p phaseWork) walBytes() int64 {
	if p.WAL != nil {
		return p.all().Bytes
	}
	return p.ClusterWAL
}

// measurePgWork starts runs new-key runs on side s (clients at once) with
// `serve`, then has `worker` execute them, each phase measured apart.
func (e *env) measurePgWork(ctx context.Context, s *side, runs, clients int) (res pgWorkResult) {
	res.Side = s.Name
	fail := func(err error) pgWorkResult {
		res.Failed = err.Error()
		say("pgwork %s failed: %v", s.Name, err)
		return res
	}
	db, err := e.freshFrom(ctx, s.tmpl)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	res.Walinspect = err == nil
	var dbOID uint32
	if err := conn.QueryRow(ctx, `SELECT oid FROM pg_database WHERE datname = current_database()`).Scan(&dbOID); err != nil {
		return fail(err)
	}
	host, port := e.pg.Host, e.pg.Port
	if strings.HasPrefix(host, "/") {
		return fail(fmt.Errorf("DATABASE_URL uses a Unix socket (%s): the capture proxy needs TCP", host))
	}
	c, err := newCapture(fmt.Sprintf("%s:%d", host, port))
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	u := *e.baseURL
	u.Host = c.Addr().String()
	u.Path = "/" + db
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	proxied := u.String()

	// phase measures what happens between begin and end (end stops the
	// process, so that its backends flush their statistics).
	phase := func(begin func() (*proc, error), work func() (int, error)) (phaseWork, error) {
		var p phaseWork
		mark := c.Mark()
		pr, err := begin()
		if err != nil {
			return p, err
		}
		defer pr.Stop(20 * time.Second)
		if res.Walinspect {
			// A temporary replication slot keeps the phase's WAL until it is
			// read: on a busy server a checkpoint would recycle it first.
			slot := fmt.Sprintf("valruns_bench_%d_%d", os.Getpid(), time.Now().UnixNano())
			if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, slot); err != nil {
				return p, fmt.Errorf("reserve the phase's WAL: %w", err)
			}
			defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) }()
		}
		lsn0, err := walLSN(ctx, conn)
		if err != nil {
			return p, err
		}
		before, err := tableStats(ctx, conn)
		if err != nil {
			return p, err
		}
		t0 := time.Now()
		if p.Runs, err = work(); err != nil {
			return p, err
		}
		p.Elapsed = time.Since(t0)
		pr.Stop(20 * time.Second)
		if pr.err != nil && !strings.Contains(pr.err.Error(), "signal") {
			return p, fmt.Errorf("%s ended with %v\n%s", pr.name, pr.err, pr.Tail())
		}
		if err := waitBackendsGone(ctx, conn, db); err != nil {
			return p, err
		}
		lsn1, err := walLSN(ctx, conn)
		if err != nil {
			return p, err
		}
		after, err := tableStats(ctx, conn)
		if err != nil {
			return p, err
		}
		p.Tables = diffTables(before, after)
		if err := conn.QueryRow(ctx, `SELECT $2::pg_lsn - $1::pg_lsn`, lsn0, lsn1).Scan(&p.ClusterWAL); err != nil {
			return p, err
		}
		if res.Walinspect {
			if p.WAL, err = walOf(ctx, conn, lsn0, lsn1, dbOID); err != nil {
				return p, fmt.Errorf("pg_walinspect: %w", err)
			}
		}
		rc := summarize(c.Window(mark, c.Mark()))
		p.Stmts, p.RoundTrips = len(rc.Stmts), rc.RoundTrips
		p.TopStmts = topStatements(rc.Stmts, 8)
		return p, nil
	}

	var base string
	res.Start, err = phase(func() (*proc, error) {
		srv, b, err := e.startServerBin(ctx, s.bin, proxied, false)
		base = b
		return srv, err
	}, func() (int, error) {
		return runs, startMany(ctx, base+s.org.startPath(), s.org.Token, []byte(startBody), runs, clients)
	})
	if err != nil {
		return fail(fmt.Errorf("start phase: %w", err))
	}
	res.Exec, err = phase(func() (*proc, error) {
		return e.startWorkerBin(ctx, s.bin, proxied)
	}, func() (int, error) {
		return waitAllFinal(ctx, conn, 5*time.Minute)
	})
	if err != nil {
		return fail(fmt.Errorf("execution phase: %w", err))
	}
	return res
}

// startMany sends n new-key starts of body, clients at once, each answered 201.
func startMany(ctx context.Context, url, token string, body []byte, n, clients int) error {
	hc := newHTTPClient(clients)
	defer hc.CloseIdleConnections()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if err := sendOnce(ctx, hc, url, body, headerFor(token, uuid.NewString())); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return cmpErr(first, ctx.Err())
}

// waitAllFinal waits until no run is queued or running, and returns how
// many runs are final.
func waitAllFinal(ctx context.Context, conn *pgx.Conn, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		var left, final int
		if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE finished_at IS NULL),
			count(*) FILTER (WHERE finished_at IS NOT NULL) FROM validation_runs`).Scan(&left, &final); err != nil {
			return 0, err
		}
		if left == 0 {
			return final, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d runs still not final after %s", left, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitBackendsGone waits until no other session uses db (the processes'
// backends have exited, and so have flushed their statistics).
func waitBackendsGone(ctx context.Context, conn *pgx.Conn, db string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, db).Scan(&n); err != nil {
			return err
		}
		if n == 0 || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// walLSN is the WAL position flushed so far: pg_walinspect (15) reads no
// further, and the measured processes' commits are flushed (synchronous_commit).
func walLSN(ctx context.Context, conn *pgx.Conn) (string, error) {
	var lsn string
	err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// tableStats reads every user table's rows written so far.
func tableStats(ctx context.Context, conn *pgx.Conn) (map[string]tableWork, error) {
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables`)
	if err != nil {
		return nil, err
	}
	out := map[string]tableWork{}
	for rows.Next() {
		var t tableWork
		if err := rows.Scan(&t.Table, &t.Ins, &t.Upd, &t.HotUpd, &t.Del); err != nil {
			return nil, err
		}
		out[t.Table] = t
	}
	return out, rows.Err()
}

// diffTables is after minus before, for the tables written, by name.
func diffTables(before, after map[string]tableWork) []tableWork {
	var out []tableWork
	for name, a := range after {
		b := before[name]
		d := tableWork{Table: name, Ins: a.Ins - b.Ins, Upd: a.Upd - b.Upd, HotUpd: a.HotUpd - b.HotUpd, Del: a.Del - b.Del}
		if d.Ins|d.Upd|d.Del != 0 {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(x, y tableWork) int { return strings.Compare(x.Table, y.Table) })
	return out
}

// walOf is the WAL of database dbOID between two positions by record kind:
// the records on its relations and the other records (commits) of their
// transactions.
func walOf(ctx context.Context, conn *pgx.Conn, from, to string, dbOID uint32) (map[string]walKind, error) {
	rows, err := conn.Query(ctx, `WITH r AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)),
		mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE $3 AND xid <> '0')
		SELECT resource_manager, record_type, count(*), coalesce(sum(record_length), 0),
			count(*) FILTER (WHERE fpi_length > 0), coalesce(sum(fpi_length), 0)
		FROM r WHERE block_ref LIKE $3 OR (xid <> '0' AND xid IN (SELECT xid FROM mine))
		GROUP BY 1, 2`, from, to, fmt.Sprintf("%% rel %%/%d/%%", dbOID))
	if err != nil {
		return nil, err
	}
	out := map[string]walKind{}
	for rows.Next() {
		var rmgr, typ string
		var k walKind
		if err := rows.Scan(&rmgr, &typ, &k.Records, &k.Bytes, &k.FPIs, &k.FPIBytes); err != nil {
			return nil, err
		}
		out[rmgr+"/"+typ] = k
	}
	return out, rows.Err()
}

// topStatements counts the statements by their normalised text (first
// line, whitespace folded, cut at 90 characters), most sent first.
func topStatements(stmts []wireStmt, n int) []stmtCount {
	counts := map[string]int{}
	for _, s := range stmts {
		counts[normSQL(s.SQL)]++
	}
	out := make([]stmtCount, 0, len(counts))
	for sql, c := range counts {
		out = append(out, stmtCount{sql, c})
	}
	slices.SortFunc(out, func(a, b stmtCount) int {
		if a.N != b.N {
			return b.N - a.N
		}
		return strings.Compare(a.SQL, b.SQL)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

func normSQL(sql string) string {
	return short(strings.Join(strings.Fields(sql), " "), 90)
}
