package models

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/valruns/valruns/idempotency"
)

// startColumns are a batch's starts as start_batch.sql takes them: one
// array per column ($1 to $24), one element per start, in the batch's
// order.
type startColumns struct {
	ids, orgs, wfs, tokens                   []pgtype.UUID // a null token: none
	subs, metas, reqIDs                      []string
	created, periods                         []time.Time
	quotas, ttls                             []int64
	locks                                    []*int64
	offs, statuses                           []int32
	keys, endpoints                          []*string
	methods, paths, headers, krids, ips, uas []string
	hashes, bodies                           [][]byte
	// keyed: a start of the batch has a key.
	keyed bool
}

func newStartColumns(n int) *startColumns {
	return &startColumns{
		ids: make([]pgtype.UUID, 0, n), orgs: make([]pgtype.UUID, 0, n), wfs: make([]pgtype.UUID, 0, n),
		tokens: make([]pgtype.UUID, 0, n), subs: make([]string, 0, n),
		metas: make([]string, 0, n), reqIDs: make([]string, 0, n), created: make([]time.Time, 0, n),
		periods: make([]time.Time, 0, n), quotas: make([]int64, 0, n), ttls: make([]int64, 0, n),
		locks: make([]*int64, 0, n), offs: make([]int32, 0, n), statuses: make([]int32, 0, n),
		keys: make([]*string, 0, n), endpoints: make([]*string, 0, n),
		methods: make([]string, 0, n), paths: make([]string, 0, n), headers: make([]string, 0, n),
		krids: make([]string, 0, n), ips: make([]string, 0, n), uas: make([]string, 0, n),
		hashes: make([][]byte, 0, n), bodies: make([][]byte, 0, n),
	}
}

// add appends a start: its run p and its key row k (nil: no key).
func (c *startColumns) add(p StartParams, k *idempotency.Key) {
	meta := "{}"
	if len(p.Metadata) > 0 {
		meta = string(p.Metadata)
	}
	c.ids, c.orgs, c.wfs = append(c.ids, uuidArg(p.ID)), append(c.orgs, uuidArg(p.OrgID)), append(c.wfs, uuidArg(p.WorkflowID))
	c.subs, c.metas, c.reqIDs = append(c.subs, string(p.Submission)), append(c.metas, meta), append(c.reqIDs, truncate(p.RequestID, 200))
	c.created, c.periods = append(c.created, p.CreatedAt), append(c.periods, UsagePeriod(p.CreatedAt))
	c.quotas, c.offs, c.tokens = append(c.quotas, p.Quota), append(c.offs, int32(slotOffset())), append(c.tokens, uuidArg(p.TokenID))
	if k == nil {
		c.keys, c.endpoints, c.locks = append(c.keys, nil), append(c.endpoints, nil), append(c.locks, nil)
		c.hashes, c.methods, c.paths, c.statuses = append(c.hashes, []byte{}), append(c.methods, "-"), append(c.paths, "-"), append(c.statuses, 0)
		c.bodies, c.headers, c.krids = append(c.bodies, []byte{}), append(c.headers, "{}"), append(c.krids, "-")
		c.ips, c.uas, c.ttls = append(c.ips, ""), append(c.uas, ""), append(c.ttls, 0)
		return
	}
	c.keyed = true
	c.keys, c.endpoints, c.locks = append(c.keys, &k.Key), append(c.endpoints, &k.Scope), append(c.locks, &k.LockID)
	c.hashes, c.methods, c.paths = append(c.hashes, k.RequestHash), append(c.methods, k.Method), append(c.paths, truncate(k.Path, 2000))
	c.statuses, c.bodies, c.headers = append(c.statuses, int32(k.Status)), append(c.bodies, k.Body), append(c.headers, string(k.Headers))
	c.krids, c.ips, c.uas = append(c.krids, truncate(k.RequestID, 200)), append(c.ips, truncate(k.ClientIP, 100)), append(c.uas, truncate(k.UserAgent, 1000))
	c.ttls = append(c.ttls, k.TTL.Microseconds())
}

// keyArgs are start_locks.sql's parameters.
func (c *startColumns) keyArgs() []any { return []any{c.orgs, c.endpoints, c.keys, c.locks} }

// args are start_batch.sql's parameters.
func (c *startColumns) args() []any {
	return []any{c.ids, c.created, c.orgs, c.wfs, c.subs, c.metas, c.quotas, c.tokens, c.reqIDs, c.keys, c.endpoints,
		c.locks, c.hashes, c.methods, c.paths, c.statuses, c.bodies, c.headers, c.krids, c.ips, c.uas, c.ttls, c.periods,
		c.offs, int32(UsageSlots)}
}
