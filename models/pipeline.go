package models

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pipe sends statements in one implicit transaction (up to its sync) and
// one round trip, like a pgx batch, except that the results of a statement
// sent with flush come back as soon as it has run, while the statements
// after it still run: the start's key locks are answered before the start
// itself waits on anything (batchWrite.send). pgx's batch cannot do that:
// the server flushes its answers only at the batch's Sync.
//
// Statements are prepared once per connection, named like pgx's statement
// cache, in the same implicit transaction: a statement's first use on a
// connection costs one more round trip, after the statements before it
// have run. Behind a transaction pooler, which allows no named statement,
// each is parsed unnamed every time, in the same round trip, with the
// description another connection's first use learnt (describedSQL). The
// pool's tracer sees the statements as one batch.
type pipe struct {
	c      *pgx.Conn
	p      *pgconn.Pipeline
	named  bool
	eqb    pgx.ExtendedQueryBuilder
	reads  []pipeRead // sent statements whose results are not read yet
	tracer pgx.BatchTracer
	tctx   context.Context
	batch  pgx.Batch // what the tracer is shown
	// sent: some statement reached the server; after that, a broken
	// connection leaves what they wrote unknown (see inDoubt).
	sent bool
}

type pipeRead struct {
	sql  string
	args []any
	read func(pgx.Rows) error
	// parsed: an unnamed Parse and its description precede the rows.
	parsed bool
}

// describedSQL holds what the server said of each statement's parameters
// and columns (the same on every connection of a schema), for the unnamed
// statements sent behind a transaction pooler.
var describedSQL sync.Map // SQL -> *pgconn.StatementDescription

// stmtCacheKey holds a connection's prepared statements (pgconn's
// CustomData): SQL -> description, and how many it forgot (for new names).
const stmtCacheKey = "valruns.pipe.statements"

type pipeStatements struct {
	bySQL  map[string]*pgconn.StatementDescription
	forgot int
}

func startPipe(ctx context.Context, c *pgx.Conn, named bool) *pipe {
	q := &pipe{c: c, named: named, tctx: ctx}
	if t, ok := c.Config().Tracer.(pgx.BatchTracer); ok {
		q.tracer = t
		q.tctx = t.TraceBatchStart(ctx, c, pgx.TraceBatchStartData{Batch: &q.batch})
	}
	q.p = c.PgConn().StartPipeline(ctx)
	return q
}

func (q *pipe) statements() *pipeStatements {
	data := q.c.PgConn().CustomData()
	s, _ := data[stmtCacheKey].(*pipeStatements)
	if s == nil {
		s = &pipeStatements{bySQL: map[string]*pgconn.StatementDescription{}}
		data[stmtCacheKey] = s
	}
	return s
}

// query sends sql with args; read gets its rows when they are read, in the
// order the statements were sent. flush asks the server to send its results
// as soon as it has run (they are read by the next query that must wait,
// or by sync).
func (q *pipe) query(sql string, args []any, read func(pgx.Rows) error, flush bool) error {
	q.batch.Queue(sql, args...)
	cache := q.statements()
	sd := cache.bySQL[sql]
	parsed := false
	if d, ok := describedSQL.Load(sql); ok && !q.named {
		// Parsed anew, unnamed, and bound at once, as described before
		// (the description is of the unnamed statement: read, never written).
		sd = d.(*pgconn.StatementDescription)
		q.p.SendPrepare("", sql, sd.ParamOIDs)
		parsed = true
	}
	if sd == nil {
		name := ""
		if q.named {
			sum := sha256.Sum256([]byte(sql))
			name = fmt.Sprintf("valruns_%s_%d", hex.EncodeToString(sum[:12]), cache.forgot)
		}
		q.p.SendPrepare(name, sql, nil)
		q.p.SendFlushRequest()
		if err := q.flush(); err != nil {
			return err
		}
		if err := q.readAll(); err != nil {
			return err
		}
		res, err := q.p.GetResults()
		if err != nil {
			return err
		}
		var ok bool
		if sd, ok = res.(*pgconn.StatementDescription); !ok {
			return fmt.Errorf("prepare: got %T", res)
		}
		sd.Name, sd.SQL = name, sql
		if q.named {
			cache.bySQL[sql] = sd
		} else {
			describedSQL.Store(sql, sd)
		}
	}
	if err := q.eqb.Build(q.c.TypeMap(), sd, args); err != nil {
		return fmt.Errorf("encode arguments: %w", err)
	}
	q.p.SendQueryStatement(sd, q.eqb.ParamValues, q.eqb.ParamFormats, slices.Clone(q.eqb.ResultFormats))
	q.reads = append(q.reads, pipeRead{sql: sql, args: args, read: read, parsed: parsed})
	if flush {
		q.p.SendFlushRequest()
		return q.flush()
	}
	return nil
}

func (q *pipe) flush() error {
	q.sent = true
	return q.p.Flush()
}

// readAll reads the results of the statements sent so far, in order.
func (q *pipe) readAll() error {
	for len(q.reads) > 0 {
		r := q.reads[0]
		q.reads = q.reads[1:]
		var res any
		var err error
		if r.parsed {
			if res, err = q.p.GetResults(); err == nil {
				if _, ok := res.(*pgconn.StatementDescription); !ok {
					err = fmt.Errorf("%T where a statement's description was due", res)
				}
			}
		}
		if err == nil {
			res, err = q.p.GetResults()
		}
		var tag pgconn.CommandTag
		if err == nil {
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				err = fmt.Errorf("%T where a statement's rows were due", res)
			} else {
				rows := pgx.RowsFromResultReader(q.c.TypeMap(), rr)
				err = r.read(rows)
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
				tag = rows.CommandTag()
			}
		}
		if q.tracer != nil {
			q.tracer.TraceBatchQuery(q.tctx, q.c, pgx.TraceBatchQueryData{SQL: r.sql, Args: r.args, CommandTag: tag, Err: err})
		}
		if err != nil {
			q.forget(r.sql, err)
			return err
		}
	}
	return nil
}

// forget drops a statement the server no longer has as it was prepared
// (a migration changed a table it reads, or a pooler lost it): the next use
// prepares it again, under a new name.
func (q *pipe) forget(sql string, err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "0A000" || pgErr.Code == "26000") {
		describedSQL.Delete(sql)
		s := q.statements()
		if _, ok := s.bySQL[sql]; ok {
			delete(s.bySQL, sql)
			s.forgot++
		}
	}
}

// sync ends the implicit transaction (it commits unless a statement
// failed), reads every result and closes the pipe. It must be called once,
// whatever happened before: with err, the error met so far, which it
// returns (the pipe is then only closed, the transaction rolled back).
func (q *pipe) sync(err error) error {
	if err == nil {
		q.p.SendPipelineSync()
		err = q.flush()
		if err == nil {
			err = q.readAll()
		}
		if err == nil {
			var res any
			if res, err = q.p.GetResults(); err == nil {
				if _, ok := res.(*pgconn.PipelineSync); !ok {
					err = fmt.Errorf("%T where the sync was due", res)
				}
			}
		}
	} else {
		// End the aborted transaction, so that Close can read what is
		// left and keep a healthy connection (a broken one it closes).
		_ = q.p.Sync()
	}
	if cerr := q.p.Close(); err == nil {
		err = cerr
	}
	if q.tracer != nil {
		q.tracer.TraceBatchEnd(q.tctx, q.c, pgx.TraceBatchEndData{Err: err})
	}
	return err
}
