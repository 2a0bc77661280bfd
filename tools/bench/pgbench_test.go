package main

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
)

// TestScriptsRunInPgbench: each hand-written script of the limit runs in
// pgbench against a database the migrations made, and each transaction
// writes what the start it stands for writes (valruns': the run, its key
// and its usage slot; gone to its slow path, it would write nothing). A
// schema change that breaks a script fails here.
func TestScriptsRunInPgbench(t *testing.T) {
	t.Parallel()
	needTool(t, "pgbench")
	ctx := context.Background()
	db, dbURL := testdb.New(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// One organisation with its workflow, a token id and this month's usage
	// slots, as the template's organisations have after their first start.
	o := benchOrg{TokenID: "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"}
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('bench', 'bench') RETURNING id`).Scan(&o.ID).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'bench') RETURNING id`, o.ID).Scan(&o.Workflow).Error)
	require.NoError(t, db.Exec(`INSERT INTO usage_slots (org_id, period, slot, runs, quota, cap)
		SELECT ?, date_trunc('month', now() AT TIME ZONE 'UTC'), g, 0, 0, 0 FROM generate_series(0, 63) g`, o.ID).Error)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	e := &env{root: root, baseURL: u, orgs: []benchOrg{o}}
	name := strings.TrimPrefix(u.Path, "/")
	count := func(q string) (n int) {
		require.NoError(t, db.Raw(q).Scan(&n).Error)
		return n
	}

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, e.checkScript(ctx, conn, name, peerSQL))
	require.Equal(t, 10, count(`SELECT count(*) FROM validation_runs`))

	require.NoError(t, e.checkScript(ctx, conn, name, startSQL))
	require.Equal(t, 20, count(`SELECT count(*) FROM validation_runs`))
	require.Equal(t, 10, count(`SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, 10, count(`SELECT count(*) FROM idempotency_keys k JOIN validation_runs r ON r.id = k.validation_run_id
		WHERE r.idempotency_key = k.key AND r.org_id = k.org_id`), "each key row names its own run")
	require.Equal(t, 10, count(`SELECT sum(runs) FROM usage_slots`), "each start billed a slot")

	// Its slow path writes nothing: a check that it went there fails.
	require.NoError(t, db.Exec(`DELETE FROM usage_slots`).Error)
	require.ErrorContains(t, e.checkScript(ctx, conn, name, startSQL), "10 transactions wrote 0 runs, want 10")
}

const pgbenchOutput = `pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: /tmp/x.sql
scaling factor: 1
query mode: prepared
number of clients: 32
number of threads: 2
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 2201
number of failed transactions: 3 (0.136%)
latency average = 71.880 ms
initial connection time = 52.310 ms
tps = 440.184712 (without initial connection time)
`

func TestParsePgbench(t *testing.T) {
	t.Parallel()
	tps, failed, aborted := parsePgbench(pgbenchOutput)
	require.InDelta(t, 440.184712, tps, 1e-6)
	require.Equal(t, 3, failed)
	require.False(t, aborted)
	out := "pgbench: error: client 0 script 0 aborted in command 3 query 0: ERROR:  boom\npgbench: error: Run was aborted; the above results are incomplete.\n"
	_, _, aborted = parsePgbench(out)
	require.True(t, aborted)
	require.Equal(t, "pgbench: error: client 0 script 0 aborted in command 3 query 0: ERROR:  boom | pgbench: error: Run was aborted; the above results are incomplete.", pgbenchErrors(out))
}
