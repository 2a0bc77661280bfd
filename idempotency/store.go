package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"time"
)

// Store is what the wrapper needs of the database that keeps the keys and
// the routes' work: a read of a key's row, and a transaction that takes the
// key's lock and commits the work with the key's row. The package defines
// it and a service implements it (valruns: models.KeyStore, on
// PostgreSQL); T is the transaction a route's Handler gets.
type Store[T Tx] interface {
	// Lookup reads k's row (by its Tenant, Scope, Key and LockID) without
	// a transaction: KeyAnswered with a live row, KeyInFlight while
	// another request holds the key, else NotDone. A row past its expiry
	// comes back as Result.Key with NotDone or KeyInFlight.
	Lookup(ctx context.Context, k *Key) (Result, error)
	// Begin begins a request's transaction, whose statements may each run
	// for at most timeout. With a key (k not nil) it takes the key's lock,
	// held until the transaction ends, unless the key's live row answers
	// the request (KeyAnswered) or another request holds the lock
	// (KeyInFlight): then nothing is begun and the returned T is not used.
	Begin(ctx context.Context, timeout time.Duration, k *Key) (T, Result, error)
	// Failure says what an error met while doing a request (from the
	// store, or from a handler's work on its transaction) means.
	Failure(err error) Failure
}

// Tx is a request's transaction as the wrapper sees it: committed with the
// key's row, or rolled back.
type Tx interface {
	// Commit writes k, the key's row with the answer (nil without a key),
	// and commits, all or nothing: Committed, with k as Result.Key and its
	// ExpiresAt set by the store. When a live row of the key exists the
	// error is ErrKeyTaken and nothing is committed.
	Commit(ctx context.Context, k *Key) (Result, error)
	// Rollback ends the transaction unless it was committed.
	Rollback()
}

// Key is one key's row: the scoped key, the request it was first used for,
// and the answer stored for that request's retries.
type Key struct {
	// Tenant, Scope and Key name the key: keys are unique per tenant and
	// scope. LockID is a hash of the three (LockID): the key's id within
	// the process, and the id a store may lock it by.
	Tenant, Scope, Key string
	LockID             int64
	// RequestHash is the first request's fingerprint (Fingerprint);
	// Method and Path are its method and path as sent.
	RequestHash  []byte
	Method, Path string
	// RequestID, ClientIP and UserAgent are the first request's.
	RequestID, ClientIP, UserAgent string
	// Status, Headers and Body are the stored answer. Headers is a JSON
	// object of the kept headers (Content-Type and Location only).
	Status  int
	Headers []byte
	Body    []byte
	// ResourceID is what the first request created (Response.ResourceID),
	// or "".
	ResourceID string
	// TTL is how long a written row answers retries: the store sets
	// ExpiresAt to its own clock plus TTL.
	TTL time.Duration
	// CreatedAt and ExpiresAt are set by the store when it writes the row.
	CreatedAt, ExpiresAt time.Time
}

// Result is what a step of a request did: a store's Lookup or Begin, a
// transaction's Commit, or a route's one-step Commit (Prepared.Commit).
type Result struct {
	// Kind says what happened; its zero value, NotDone, that nothing was
	// written and nothing answers the request yet.
	Kind Kind
	// Key is the key's row: the live one that answers the request
	// (KeyAnswered), the one just written (Committed), or an expired one
	// that the request's work will succeed (NotDone, KeyInFlight).
	Key *Key
	// Replaced: the key had an expired row when this one was written
	// (Committed): the key was used again after its expiry.
	Replaced bool
}

// Kind is what a step did with a request.
type Kind int

const (
	// NotDone: nothing was written and the key is free: the request is
	// still to be done (in its transaction, after a one-step Commit).
	NotDone Kind = iota
	// Committed: the work committed, with the key's row when there is a key.
	Committed
	// KeyInFlight: nothing was written; another request holds the key.
	KeyInFlight
	// KeyAnswered: nothing was written; the key's live row (Result.Key)
	// answers the request.
	KeyAnswered
)

// ErrKeyTaken is a commit's error when another request committed the key's
// row first: nothing of this request was written, and the wrapper answers
// with that row.
var ErrKeyTaken = errors.New("idempotency key taken by another request")

// Failure is what an error met while doing a request means for its answer.
// Every one is a 5xx with Retry-After, and nothing is stored.
type Failure int

const (
	// Internal: anything else (500).
	Internal Failure = iota
	// Unavailable: the store could not be reached or did not answer;
	// nothing was done (503 service_unavailable).
	Unavailable
	// Timeout: the work ran past its time and was rolled back (503
	// request_timeout).
	Timeout
	// OutcomeUnknown: the commit was sent and its answer never came, so
	// whether it committed is unknown (503 saying so).
	OutcomeUnknown
)

// LockID is the id of the scoped key (tenant, scope, key): 64 bits of
// SHA-256, so two keys share an id (and one sees a spurious 409) with
// negligible odds.
func LockID(tenant, scope, key string) int64 {
	h := sha256.New()
	for _, s := range []string{tenant, scope, key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}
