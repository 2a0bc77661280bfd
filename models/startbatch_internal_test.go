package models

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/idempotency"
)

// A batch is formed by turns between organisations: an organisation alone
// fills it in arrival order; with others waiting, each gets its share, so
// that a backlog of one does not hold another's start for more than one
// statement. Two starts of one key never share a batch.
func TestFormBatchTakesOrganisationsInTurn(t *testing.T) {
	t.Parallel()
	// start is a start of org named name, keyed when key is not "".
	start := func(org, name, key string) *startReq {
		r := &startReq{p: StartParams{OrgID: org, RequestID: name}}
		if key != "" {
			r.k = &idempotency.Key{LockID: idempotency.LockID(org, "workflow_start", key)}
		}
		return r
	}
	// backlog is n starts of org, named org0, org1...; keyed: each its own key.
	backlog := func(org string, n int, keyed bool) []*startReq {
		var rs []*startReq
		for i := range n {
			name, key := fmt.Sprintf("%s%d", org, i), ""
			if keyed {
				key = name
			}
			rs = append(rs, start(org, name, key))
		}
		return rs
	}
	queue := func(parts ...[]*startReq) []*startReq {
		var q []*startReq
		for _, p := range parts {
			q = append(q, p...)
		}
		return q
	}
	names := func(rs []*startReq) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.p.RequestID)
		}
		return out
	}

	for _, tc := range []struct {
		name        string
		queue       []*startReq
		batch, rest []string
	}{
		{"an organisation alone fills the batch in order", backlog("a", 6, true),
			[]string{"a0", "a1", "a2", "a3"}, []string{"a4", "a5"}},
		{"a newcomer goes in the next batch, not behind the backlog", queue(backlog("a", 6, false), backlog("b", 1, false)),
			[]string{"a0", "b0", "a1", "a2"}, []string{"a3", "a4", "a5"}},
		{"organisations take turns, oldest first", queue(backlog("a", 3, false), backlog("b", 3, false), backlog("c", 1, false)),
			[]string{"a0", "b0", "c0", "a1"}, []string{"a2", "b1", "b2"}},
		{"a second start of a key waits for the next batch",
			queue([]*startReq{start("a", "first", "k"), start("a", "again", "k")}, backlog("a", 4, false)),
			[]string{"first", "a0", "a1", "a2"}, []string{"again", "a3"}},
		{"less than a batch goes whole", queue(backlog("a", 2, false), backlog("b", 1, false)),
			[]string{"a0", "b0", "a1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch, rest := formBatch(tc.queue, 4)
			require.Equal(t, tc.batch, names(batch))
			require.Equal(t, tc.rest, names(rest))
		})
	}
}
