package idempotency_test

// The wrapper protecting a route of another service, POST /notes, which
// creates a note in a table of its own, with valruns' Store on PostgreSQL
// (models.KeyStore, over the idempotency_keys table of migrations/): the
// contract holds there as it does in ExampleWrapper_Wrap's memory.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// noteRequest is the body of POST /notes.
type noteRequest struct {
	Text string `json:"text"`
}

// noteRoutes are the notes service's handlers.
type noteRoutes struct {
	// inserting, when set, is called inside the transaction before the
	// note is written (the test holds a request there).
	inserting func()
}

// prepare reads the body, once. A body the route refuses is answered in the
// request's transaction all the same, so that the 400 is stored with the
// key and replayed; a good one travels, decoded, to create.
func (n *noteRoutes) prepare(req idempotency.Request) (idempotency.Prepared[*models.RequestTx], error) {
	var in noteRequest
	if err := json.Unmarshal(req.Body, &in); err != nil || in.Text == "" {
		return idempotency.Prepared[*models.RequestTx]{Handle: func(_ *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
			return idempotency.Problem(req, problem.New(http.StatusBadRequest, problem.ValidationError, "text is required")), nil
		}}, nil
	}
	return idempotency.Prepared[*models.RequestTx]{Handle: func(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
		return n.create(tx, req, in)
	}}, nil
}

// create writes the note on the request's transaction and answers 201. The
// wrapper commits the note together with the stored answer, or neither.
func (n *noteRoutes) create(tx *models.RequestTx, _ idempotency.Request, in noteRequest) (idempotency.Response, error) {
	if n.inserting != nil {
		n.inserting()
	}
	var id int64
	if err := tx.DB().Raw(`INSERT INTO notes (text) VALUES (?) RETURNING id`, in.Text).Scan(&id).Error; err != nil {
		return idempotency.Response{}, err // 500, rolled back, nothing stored: a retry tries again
	}
	return idempotency.JSON(http.StatusCreated, map[string]any{"id": id, "text": in.Text})
}

// notesTenant is the one tenant of the example. Keys are unique per tenant
// and scope; models' key store keeps the tenant in a uuid column.
const notesTenant = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"

// newNotesServer builds the notes service on a fresh database, its route
// read by prep (such as noteRoutes.prepare).
func newNotesServer(t *testing.T, prep idempotency.Preparer[*models.RequestTx]) (*gin.Engine, *gorm.DB) {
	db, _ := testdb.New(t)
	require.NoError(t, db.Exec(`CREATE TABLE notes (id bigserial PRIMARY KEY, text text NOT NULL)`).Error)

	w := idempotency.New(models.NewKeyStore(db), idempotency.Config{
		Tenant: func(*gin.Context) string { return notesTenant },
	})
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.POST("/notes", w.WrapPrepared("note_create", prep))
	return r, db
}

// postNote sends POST /notes with body and an Idempotency-Key.
func postNote(r *gin.Engine, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/notes", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	return rec
}

func countNotes(t *testing.T, db *gorm.DB) int64 {
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM notes`).Scan(&n).Error)
	return n
}

// TestNotesExample: a route of another service, made idempotent. The first
// request creates the note; its retry gets the same answer back without a
// second note; the key with another body is 422; a bad body's 400 is
// stored like any answer.
func TestNotesExample(t *testing.T) {
	t.Parallel()
	r, db := newNotesServer(t, (&noteRoutes{}).prepare)

	first := postNote(r, "note-1", `{"text":"buy milk"}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.Empty(t, first.Header().Get(idempotency.HeaderReplayed))

	retry := postNote(r, "note-1", `{ "text": "buy milk" }`) // the same JSON, spelled otherwise
	require.Equal(t, http.StatusCreated, retry.Code)
	require.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
	require.Equal(t, first.Body.String(), retry.Body.String(), "the first answer, byte for byte")
	require.Equal(t, int64(1), countNotes(t, db), "one note for two requests")

	other := postNote(r, "note-1", `{"text":"buy bread"}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.Code)
	require.Contains(t, other.Body.String(), idempotency.CodeKeyReused)

	bad := postNote(r, "note-2", `{}`)
	require.Equal(t, http.StatusBadRequest, bad.Code)
	again := postNote(r, "note-2", `{}`)
	require.Equal(t, http.StatusBadRequest, again.Code)
	require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "a 4xx is stored and replayed too")
	require.Equal(t, int64(1), countNotes(t, db))
}

// TestNotesExampleInFlight: while the first request with a key is still
// being done, a duplicate is 409 with Retry-After, and nothing is done
// twice; once the first has finished, the duplicate's retry replays it.
func TestNotesExampleInFlight(t *testing.T) {
	t.Parallel()
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	routes := &noteRoutes{inserting: func() {
		once.Do(func() { // hold the first request only
			close(inside)
			<-release
		})
	}}
	r, db := newNotesServer(t, routes.prepare)
	t.Cleanup(func() { // a failed check must not leave the first request held
		select {
		case <-release:
		default:
			close(release)
		}
	})

	firstDone := make(chan *httptest.ResponseRecorder)
	go func() { firstDone <- postNote(r, "note-3", `{"text":"call Ana"}`) }()
	<-inside // the first request holds the key, inside its transaction

	dup := postNote(r, "note-3", `{"text":"call Ana"}`)
	require.Equal(t, http.StatusConflict, dup.Code)
	require.Contains(t, dup.Body.String(), idempotency.CodeKeyInProgress)
	require.NotEmpty(t, dup.Header().Get("Retry-After"))

	close(release)
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())

	retry := postNote(r, "note-3", `{"text":"call Ana"}`)
	require.Equal(t, http.StatusCreated, retry.Code)
	require.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
	require.Equal(t, first.Body.String(), retry.Body.String())
	require.Equal(t, int64(1), countNotes(t, db))
}
