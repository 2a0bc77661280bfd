package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/problem"
)

// memStore is a Store of a service of its own: support tickets, kept in
// memory with their keys. It shows what a Store promises; valruns' own is
// models.KeyStore, on PostgreSQL, where the tests run.
type memStore struct {
	mu      sync.Mutex
	keys    map[string]*idempotency.Key // by tenant, scope and key
	held    map[int64]bool              // the keys' locks, by LockID
	tickets []string
}

// memTx is a request's transaction on memStore: its tickets are written
// at Commit, with the key's row, or not at all.
type memTx struct {
	s       *memStore
	lock    *int64 // the key's lock it holds, if any
	tickets []string
}

func newMemStore() *memStore {
	return &memStore{keys: map[string]*idempotency.Key{}, held: map[int64]bool{}}
}

func rowName(k *idempotency.Key) string { return k.Tenant + "\x00" + k.Scope + "\x00" + k.Key }

// state is what k's row and lock say of a request with k (s.mu held).
func (s *memStore) state(k *idempotency.Key) idempotency.Result {
	row := s.keys[rowName(k)]
	switch {
	case row != nil && time.Now().Before(row.ExpiresAt):
		return idempotency.Result{Kind: idempotency.KeyAnswered, Key: row}
	case s.held[k.LockID]:
		return idempotency.Result{Kind: idempotency.KeyInFlight, Key: row}
	}
	return idempotency.Result{Kind: idempotency.NotDone, Key: row}
}

func (s *memStore) Lookup(_ context.Context, k *idempotency.Key) (idempotency.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state(k), nil
}

func (s *memStore) Begin(_ context.Context, _ time.Duration, k *idempotency.Key) (*memTx, idempotency.Result, error) {
	tx := &memTx{s: s}
	if k == nil {
		return tx, idempotency.Result{}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if res := s.state(k); res.Kind != idempotency.NotDone {
		return nil, res, nil
	}
	s.held[k.LockID] = true
	tx.lock = &k.LockID
	return tx, idempotency.Result{}, nil
}

func (s *memStore) Failure(error) idempotency.Failure { return idempotency.Internal }

func (tx *memTx) Commit(_ context.Context, k *idempotency.Key) (idempotency.Result, error) {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	defer tx.unlock()
	res := idempotency.Result{Kind: idempotency.Committed, Key: k}
	if k != nil {
		old := s.keys[rowName(k)]
		if old != nil && time.Now().Before(old.ExpiresAt) {
			return idempotency.Result{}, idempotency.ErrKeyTaken
		}
		k.CreatedAt = time.Now()
		k.ExpiresAt = k.CreatedAt.Add(k.TTL)
		s.keys[rowName(k)], res.Replaced = k, old != nil
	}
	s.tickets = append(s.tickets, tx.tickets...)
	return res, nil
}

func (tx *memTx) Rollback() {
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	tx.unlock()
}

// unlock gives the key's lock back (s.mu held).
func (tx *memTx) unlock() {
	if tx.lock != nil {
		delete(tx.s.held, *tx.lock)
		tx.lock = nil
	}
}

// createTicket is the route's handler: it writes the ticket on the
// request's transaction and answers 201.
func createTicket(tx *memTx, req idempotency.Request) (idempotency.Response, error) {
	var in struct {
		Subject string `json:"subject"`
	}
	if err := json.Unmarshal(req.Body, &in); err != nil || in.Subject == "" {
		return idempotency.Problem(req, problem.New(http.StatusBadRequest, problem.ValidationError, "subject is required")), nil
	}
	tx.tickets = append(tx.tickets, in.Subject)
	return idempotency.JSON(http.StatusCreated, map[string]string{"subject": in.Subject})
}

// A route of another service, POST /tickets, made idempotent with a store of
// its own, shared by two processes of the service: a retry gets the first
// answer back without a second ticket, whichever process it reaches, and
// the key sent with another body is 422.
func ExampleWrapper_Wrap() {
	store := newMemStore()
	gin.SetMode(gin.ReleaseMode)
	process := func() *gin.Engine {
		w := idempotency.New(store, idempotency.Config{Tenant: func(*gin.Context) string { return "acme" }})
		r := gin.New()
		r.POST("/tickets", w.Wrap("ticket_create", createTicket))
		return r
	}
	a, b := process(), process()

	send := func(r *gin.Engine, key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/tickets", strings.NewReader(body))
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		answer := rec.Body.String()
		var p struct {
			Code string `json:"code"`
		}
		if rec.Code >= 300 && json.Unmarshal(rec.Body.Bytes(), &p) == nil {
			answer = p.Code // a problem document, which names its request
		}
		fmt.Println(rec.Code, "replayed:", rec.Header().Get(idempotency.HeaderReplayed) == "true", answer)
	}
	send(a, "t-1", `{"subject":"printer on fire"}`)
	send(b, "t-1", `{ "subject": "printer on fire" }`) // the same request, spelled otherwise
	send(a, "t-1", `{"subject":"coffee machine"}`)
	send(a, "t-2", `{}`)
	send(b, "t-2", `{}`) // a 4xx is stored and replayed too
	fmt.Println("tickets:", store.tickets)
	// Output:
	// 201 replayed: false {"subject":"printer on fire"}
	// 201 replayed: true {"subject":"printer on fire"}
	// 422 replayed: false idempotency_key_reused
	// 400 replayed: false validation_error
	// 400 replayed: true validation_error
	// tickets: [printer on fire]
}
