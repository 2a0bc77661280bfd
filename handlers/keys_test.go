package handlers_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// Every stored and replayed answer, and a 422, says when its key expires
// (Idempotency-Key-Expires, an HTTP-date): the expiry stored with the key.
func TestKeyExpiresHeader(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	r := f.start(idemBody, idemKey("exp-1")...)
	require.Equal(t, http.StatusCreated, r.Status)
	exp, err := http.ParseTime(r.Header.Get(idempotency.HeaderKeyExpires))
	require.NoError(t, err, "an HTTP-date: %q", r.Header.Get(idempotency.HeaderKeyExpires))
	row := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "exp-1")
	require.True(t, row.ExpiresAt.Truncate(time.Second).Equal(exp), "the stored expiry: %s vs %s", row.ExpiresAt, exp)
	require.Equal(t, 24*time.Hour, row.ExpiresAt.Sub(row.CreatedAt), "IDEMPOTENCY_TTL")

	replay := f.start(idemBody, idemKey("exp-1")...)
	require.Equal(t, "true", replay.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, r.Header.Get(idempotency.HeaderKeyExpires), replay.Header.Get(idempotency.HeaderKeyExpires))
	mismatch := f.start(idemBodyB, idemKey("exp-1")...)
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.Status)
	require.Equal(t, r.Header.Get(idempotency.HeaderKeyExpires), mismatch.Header.Get(idempotency.HeaderKeyExpires))

	// A stored 4xx says it too; no key, nothing to say.
	notFound := f.e.Do(http.MethodPost, idemStartPath("00000000-0000-0000-0000-000000000000"), f.org.Token, idemBody, idemKey("exp-2")...)
	require.Equal(t, http.StatusNotFound, notFound.Status)
	require.NotEmpty(t, notFound.Header.Get(idempotency.HeaderKeyExpires))
	require.Empty(t, f.start(idemBody).Header.Get(idempotency.HeaderKeyExpires))
}

// GET /api/idempotency-keys/{scope}/{key} answers "did my request go
// through?" for the organisation's own keys only.
func TestGetIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, nil)
	other := f.e.NewOrg("globex")
	get := func(token, scope, key string) apitest.Response {
		return f.e.Do(http.MethodGet, "/api/idempotency-keys/"+scope+"/"+url.PathEscape(key), token, nil)
	}
	// A key with the characters a path needs escaped.
	const odd = `order/1042 ?#%"x`
	first := f.start(idemBody, "X-Request-Id", "req-first-42", idempotency.HeaderKey, odd)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	runID := idemRunID(t, first)

	var k handlers.IdempotencyKey
	r := get(f.org.Token, "workflow_start", odd)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	r.JSON(t, &k)
	require.Equal(t, "finished", k.State)
	require.Equal(t, "workflow_start", k.Scope)
	require.Equal(t, odd, k.Key)
	require.Equal(t, "req-first-42", k.RequestID)
	require.Equal(t, http.StatusCreated, k.ResponseStatus)
	require.Equal(t, http.MethodPost, k.RequestMethod)
	require.NotNil(t, k.ValidationRunID)
	require.Equal(t, runID, *k.ValidationRunID)
	require.NotNil(t, k.CreatedAt)
	require.Equal(t, 24*time.Hour, k.ExpiresAt.Sub(*k.CreatedAt))
	require.Equal(t, f.counts(t, f.org.ID), idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, "reading changes nothing")

	// Another organisation's key, an unknown key, an unknown scope: 404.
	requireProblem(t, get(other.Token, "workflow_start", odd), http.StatusNotFound, "not_found")
	requireProblem(t, get(f.org.Token, "workflow_start", "never-used"), http.StatusNotFound, "not_found")
	requireProblem(t, get(f.org.Token, "workflow_create", odd), http.StatusNotFound, "not_found")
	requireProblem(t, get(f.org.Token, "nope", odd), http.StatusNotFound, "not_found")
	requireProblem(t, get(f.org.Token, "workflow_start", "clé"), http.StatusBadRequest, "validation_error")
	requireProblem(t, get("", "workflow_start", odd), http.StatusUnauthorized, "unauthenticated")

	// In flight: in_progress, and when to look again.
	release := idemHoldKeyLock(t, f.e, f.org.ID, "workflow_start", "busy-1")
	r = get(f.org.Token, "workflow_start", "busy-1")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	k = handlers.IdempotencyKey{}
	r.JSON(t, &k)
	require.Equal(t, handlers.IdempotencyKey{Scope: "workflow_start", Key: "busy-1", State: "in_progress"}, k)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	release()

	// A stored 404 is a finished key with its status and no run.
	require.Equal(t, http.StatusNotFound, f.e.Do(http.MethodPost, idemStartPath("00000000-0000-0000-0000-000000000000"),
		f.org.Token, idemBody, idemKey("k404")...).Status)
	r = get(f.org.Token, "workflow_start", "k404")
	k = handlers.IdempotencyKey{}
	r.JSON(t, &k)
	require.Equal(t, http.StatusNotFound, k.ResponseStatus)
	require.Nil(t, k.ValidationRunID)

	// Expired.
	require.NoError(t, f.e.DB.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '2 days', expires_at = now() - interval '1 day'
		WHERE key = ?`, odd).Error)
	r = get(f.org.Token, "workflow_start", odd)
	k = handlers.IdempotencyKey{}
	r.JSON(t, &k)
	require.Equal(t, "expired", k.State)
}
