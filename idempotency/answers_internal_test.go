package idempotency

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAnswerCacheLockIDCollision: two keys sharing a lock id (64 bits of
// SHA-256: negligible odds, but not none) never get each other's answer.
func TestAnswerCacheLockIDCollision(t *testing.T) {
	t.Parallel()
	a := newAnswerCache()
	const id = 42
	a.put(&answer{row: &Key{LockID: id, Tenant: "org", Scope: "scope", Key: "b", Status: 201, Body: []byte(`{"b":1}`),
		ExpiresAt: time.Now().Add(time.Hour)}})
	require.Nil(t, a.get(id, "org", "scope", "a"), "another key")
	require.Nil(t, a.get(id, "other", "scope", "b"), "another tenant")
	require.Nil(t, a.get(id, "org", "other", "b"), "another scope")
	got := a.get(id, "org", "scope", "b")
	require.NotNil(t, got)
	require.Equal(t, `{"b":1}`, string(got.row.Body))
}
