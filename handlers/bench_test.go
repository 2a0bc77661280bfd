package handlers_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"testing"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// BenchmarkStart measures one start request through the real router and
// PostgreSQL in each idempotency situation. `make bench` prints each one's
// time as a ratio of the no-key start: what the idempotency layer costs.
func BenchmarkStart(b *testing.B) {
	e := apitest.New(b)
	org := e.NewOrg("bench")
	wf := e.NewWorkflow(org, map[string]any{"name": "bench"})
	path := "/api/workflows/" + wf + "/start/"
	body := `{"submission":{"customer":"ACME","total":42,"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]},"metadata":{"source":"bench"}}`
	expect := func(b *testing.B, r apitest.Response, status int) {
		if r.Status != status {
			b.Fatalf("want %d, got %d: %s", status, r.Status, r.Body)
		}
	}

	b.Run("no_key", func(b *testing.B) {
		for b.Loop() {
			expect(b, e.Do(http.MethodPost, path, org.Token, body), http.StatusCreated)
		}
	})
	b.Run("new_key", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			expect(b, e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", fmt.Sprintf("new-%d", i)), http.StatusCreated)
		}
	})
	b.Run("replay", func(b *testing.B) {
		expect(b, e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", "replayed"), http.StatusCreated)
		for b.Loop() {
			expect(b, e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", "replayed"), http.StatusCreated)
		}
	})
	b.Run("mismatch_422", func(b *testing.B) {
		other := `{"submission":{"customer":"ACME","total":43}}`
		for b.Loop() {
			expect(b, e.Do(http.MethodPost, path, org.Token, other, "Idempotency-Key", "replayed"), http.StatusUnprocessableEntity)
		}
	})
	b.Run("in_flight_409", func(b *testing.B) {
		// Another connection holds the key's lock, as a request in flight does.
		holder, err := sql.Open("pgx", e.DBURL)
		if err != nil {
			b.Fatal(err)
		}
		defer holder.Close()
		tx, err := holder.BeginTx(context.Background(), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec(`SELECT pg_advisory_xact_lock($1)`, idempotency.LockID(org.ID, handlers.ScopeWorkflowStart, "busy")); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			expect(b, e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", "busy"), http.StatusConflict)
		}
	})
}

// BenchmarkHotKey is the storm of the "hot key" failure (docs/design.md, #proof): many clients retry
// one finished key at once; each answer is one indexed read.
func BenchmarkHotKey(b *testing.B) {
	e := apitest.New(b)
	org := e.NewOrg("hot")
	wf := e.NewWorkflow(org, map[string]any{"name": "hot"})
	path := "/api/workflows/" + wf + "/start/"
	body := `{"submission":{"n":1}}`
	if r := e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", "hot"); r.Status != http.StatusCreated {
		b.Fatal(r.Status)
	}
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r := e.Do(http.MethodPost, path, org.Token, body, "Idempotency-Key", "hot"); r.Status != http.StatusCreated {
				b.Errorf("status %d", r.Status)
				return
			}
		}
	})
	if n := e.Count("validation_runs", ""); n != 1 {
		b.Fatalf("%d runs, want 1", n)
	}
}
