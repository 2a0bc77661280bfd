package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	e := &env{root: root, pg: cfg, baseURL: u, orgs: []benchOrg{o}}
	name := strings.TrimPrefix(u.Path, "/")
	count := func(q string) (n int) {
		require.NoError(t, db.Raw(q).Scan(&n).Error)
		return n
	}

	require.NoError(t, e.checkScript(ctx, name, peerSQL))
	require.Equal(t, 10, count(`SELECT count(*) FROM validation_runs`))

	require.NoError(t, e.checkScript(ctx, name, startSQL))
	require.Equal(t, 20, count(`SELECT count(*) FROM validation_runs`))
	require.Equal(t, 10, count(`SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, 10, count(`SELECT count(*) FROM idempotency_keys k JOIN validation_runs r ON r.id = k.validation_run_id
		WHERE r.idempotency_key = k.key AND r.org_id = k.org_id`), "each key row names its own run")
	require.Equal(t, 10, count(`SELECT sum(runs) FROM usage_slots`), "each start billed a slot")

	// Its slow path writes nothing: a check that it went there fails.
	require.NoError(t, db.Exec(`DELETE FROM usage_slots`).Error)
	require.ErrorContains(t, e.checkScript(ctx, name, startSQL), "10 transactions wrote 0 runs, want 10")
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
	r := parsePgbench(pgbenchOutput)
	require.InDelta(t, 440.184712, r.TPS, 1e-6)
	require.Equal(t, 2201, r.Done)
	require.Equal(t, 3, r.Failed)
	require.Equal(t, 71880*time.Microsecond, r.Latency)
	require.False(t, r.Aborted)
	r = parsePgbench("pgbench: error: client 0 script 0 aborted in command 3 query 0: ERROR:  boom\npgbench: error: Run was aborted; the above results are incomplete.\n")
	require.True(t, r.Aborted)
	require.Equal(t, "pgbench: error: client 0 script 0 aborted in command 3 query 0: ERROR:  boom | pgbench: error: Run was aborted; the above results are incomplete.", pgbenchErrors(r.Output))
}

func TestReadTxLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// client_id transaction_no time script_no time_epoch time_us
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tx.1"), []byte("0 0 1500 0 1700000000 1\n1 0 500 0 1700000000 2\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tx.1.1"), []byte("2 0 1000 0 1700000000 3\n"), 0o644))
	lat, err := readTxLogs(dir)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{500 * time.Microsecond, 1000 * time.Microsecond, 1500 * time.Microsecond}, lat)
}
