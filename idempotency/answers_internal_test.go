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
	a.put(&storedAnswer{lockID: id, tenant: "org", scope: "scope", key: "b", status: 201, body: []byte(`{"b":1}`),
		expiresAt: time.Now().Add(time.Hour)})
	require.Nil(t, a.get(id, "org", "scope", "a"), "another key")
	require.Nil(t, a.get(id, "other", "scope", "b"), "another tenant")
	require.Nil(t, a.get(id, "org", "other", "b"), "another scope")
	got := a.get(id, "org", "scope", "b")
	require.NotNil(t, got)
	require.Equal(t, `{"b":1}`, string(got.body))
}
