package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
)

// TestPreparedCommitDeclines: when a Prepared's one step cannot decide the
// request (NotDone, nothing written), its Handle does it in the
// transaction with what the Preparer read: the body is read once per
// request, and the contract holds on that path as on the other.
func TestPreparedCommitDeclines(t *testing.T) {
	t.Parallel()
	var prepared, commits atomic.Int64
	routes := &noteRoutes{}
	prep := func(req idempotency.Request) (idempotency.Prepared[*models.RequestTx], error) {
		prepared.Add(1)
		p, err := routes.prepare(req)
		p.Response = idempotency.Response{Status: http.StatusCreated, Body: []byte(`{}`), Header: http.Header{}}
		p.Commit = func(context.Context, *idempotency.Key) (idempotency.Result, error) {
			commits.Add(1)
			return idempotency.Result{Kind: idempotency.NotDone}, nil
		}
		return p, err
	}
	r, db := newNotesServer(t, prep)

	first := postNote(r, "declined-1", `{"text":"water the plants"}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.Contains(t, first.Body.String(), "water the plants", "Handle's answer, not the one-step one")
	require.Equal(t, int64(1), prepared.Load(), "the body is read once")
	require.Equal(t, int64(1), commits.Load())

	retry := postNote(r, "declined-1", `{"text":"water the plants"}`)
	require.Equal(t, http.StatusCreated, retry.Code)
	require.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
	require.Equal(t, first.Body.String(), retry.Body.String())
	require.Equal(t, int64(1), countNotes(t, db))
}
