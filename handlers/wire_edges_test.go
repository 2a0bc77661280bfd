package handlers_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// wireServer serves e on a real listener with the read timeout given (the
// production server has one too).
func wireServer(t *testing.T, e *apitest.Env, readTimeout time.Duration) string {
	srv := httptest.NewUnstartedServer(e.Handler)
	srv.Config.ReadTimeout = readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// wireWorkflow is a server on a real listener (wireServer) with an
// organisation and a workflow of its to start.
func wireWorkflow(t *testing.T, readTimeout time.Duration, opts ...apitest.Options) (*apitest.Env, apitest.Org, string, string) {
	e := apitest.New(t, opts...)
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, idemWorkflowBody)
	return e, org, wf, wireServer(t, e, readTimeout)
}

// rawRequest writes head (the request line and headers, CRLF-separated,
// without the blank line) and then body on a new connection, and returns
// the connection and a reader of its answers.
func rawRequest(t *testing.T, addr, head string, body []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	// A bound on a loaded machine, not what is checked.
	require.NoError(t, conn.SetDeadline(time.Now().Add(60*time.Second)))
	_, err = conn.Write(append([]byte(strings.ReplaceAll(head, "\n", "\r\n")+"\r\n\r\n"), body...))
	require.NoError(t, err)
	return conn, bufio.NewReader(conn)
}

func readAnswer(t *testing.T, br *bufio.Reader) apitest.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apitest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// A body that arrives slower than the server's read timeout is a 408 the
// client may send again, not a 400 invalid_json that says the request was
// wrong; nothing is stored, and the same key then executes.
func TestSlowBodyIs408(t *testing.T) {
	t.Parallel()
	e, org, wf, addr := wireWorkflow(t, time.Second)
	body := `{"submission":1}`
	for _, key := range []string{"", "slow-1"} {
		head := fmt.Sprintf("POST /api/workflows/%s/start/ HTTP/1.1\nHost: x\nAuthorization: Bearer %s\nContent-Type: application/json\nContent-Length: %d", wf, org.Token, len(body))
		if key != "" {
			head += "\nIdempotency-Key: " + key
		}
		// Half the body, then nothing: the server's read deadline passes.
		_, br := rawRequest(t, addr, head, []byte(body[:5]))
		r := readAnswer(t, br)
		requireProblem(t, r, http.StatusRequestTimeout, idempotency.CodeBodyTimeout)
	}
	require.Zero(t, e.Count("idempotency_keys", ""))
	require.Zero(t, e.Count("validation_runs", ""))
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, body, idempotency.HeaderKey, "slow-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
}

func gzipped(t *testing.T, s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// Content-Encoding is honoured: a gzip body is decoded, with MAX_BODY_BYTES
// counted after decoding (a small gzip of a large body is 413); a body in
// an encoding the server does not decode is 415, with a bounded detail,
// never decoded as if it were plain.
func TestContentEncoding(t *testing.T) {
	t.Parallel()
	e, org, wf, addr := wireWorkflow(t, time.Minute, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 4096 }})
	send := func(enc string, body []byte, key string) apitest.Response {
		head := fmt.Sprintf("POST /api/workflows/%s/start/ HTTP/1.1\nHost: x\nAuthorization: Bearer %s\nContent-Type: application/json\nContent-Length: %d\nIdempotency-Key: %s",
			wf, org.Token, len(body), key)
		if enc != "" {
			head += "\nContent-Encoding: " + enc
		}
		_, br := rawRequest(t, addr, head, body)
		return readAnswer(t, br)
	}

	r := send("gzip", gzipped(t, `{"submission":{"total":42}}`), "gz-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)
	require.Equal(t, map[string]any{"total": float64(42)}, run["submission"])
	// A retry sent plain is the same request.
	again := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, `{"submission":{"total":42}}`, idempotency.HeaderKey, "gz-1")
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "%s", again.Body)

	big := gzipped(t, `{"submission":"`+strings.Repeat("a", 100_000)+`"}`)
	require.Less(t, len(big), 4096)
	requireProblem(t, send("gzip", big, "gz-2"), http.StatusRequestEntityTooLarge, idempotency.CodeBodyTooLarge)
	requireProblem(t, send("gzip", []byte(`{"submission":1}`), "gz-3"), http.StatusBadRequest, idempotency.CodeInvalidJSON)

	for _, enc := range []string{"br", "deflate", "gzip, br", "compress", strings.Repeat("x", 5000)} {
		r := send(enc, []byte(`{"submission":1}`), "enc-1")
		p := requireProblem(t, r, http.StatusUnsupportedMediaType, "unsupported_content_encoding")
		require.Less(t, len(p["detail"].(string)), 200, "the detail quotes a bounded part of the header")
		require.Equal(t, "gzip", r.Header.Get("Accept-Encoding"))
	}
	require.Zero(t, e.Count("idempotency_keys", "key <> 'gz-1'"))
	require.EqualValues(t, 1, e.Count("validation_runs", ""))
}

// Expect: 100-continue with a Content-Length over MAX_BODY_BYTES is
// answered 413 at once: the server never sends 100 Continue, so the client
// never sends the body.
func TestExpectContinueOverTheLimitIs413(t *testing.T) {
	t.Parallel()
	e, org, wf, addr := wireWorkflow(t, time.Minute, apitest.Options{Config: func(c *config.Config) { c.MaxBodyBytes = 1024 }})
	for _, tt := range []struct{ path, key string }{
		{"/api/workflows/", ""}, {"/api/workflows/", "big-1"}, {"/api/workflows/" + wf + "/start/", "big-2"},
	} {
		head := fmt.Sprintf("POST %s HTTP/1.1\nHost: x\nAuthorization: Bearer %s\nContent-Type: application/json\nContent-Length: 2000000\nExpect: 100-continue", tt.path, org.Token)
		if tt.key != "" {
			head += "\nIdempotency-Key: " + tt.key
		}
		_, br := rawRequest(t, addr, head, nil) // the body waits for 100 Continue
		r := readAnswer(t, br)
		require.NotEqual(t, http.StatusContinue, r.Status, "invited the body")
		requireProblem(t, r, http.StatusRequestEntityTooLarge, idempotency.CodeBodyTooLarge)
	}
	require.Zero(t, e.Count("idempotency_keys", ""))
}

// An answer given before the body is read (here 401: the token is checked
// first) reads the rest of the body before it goes out: net/http closes a
// connection that leaves more than 256 KB of a body unread, and a client
// still sending it then meets a reset, often before it reads the answer.
// The connection stays open for the client's next request.
func TestAnEarlyAnswerReadsTheBodyFirst(t *testing.T) {
	t.Parallel()
	e, _, wf, addr := wireWorkflow(t, time.Minute)
	body := `{"submission":"` + strings.Repeat("x", 1_000_000) + `"}`
	head := fmt.Sprintf("POST /api/workflows/%s/start/ HTTP/1.1\nHost: x\nAuthorization: Bearer not-a-token\nContent-Type: application/json\nContent-Length: %d\nIdempotency-Key: early-1", wf, len(body))
	// The whole body is written before the answer is read: the server
	// must read it (rawRequest fails on a write the server cut off).
	conn, br := rawRequest(t, addr, head, []byte(body))
	r := readAnswer(t, br)
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	require.NotEqual(t, "close", r.Header.Get("Connection"), "the server closes the connection, with the body unread")
	_, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, readAnswer(t, br).Status, "the next request on the connection")
	require.Zero(t, e.Count("idempotency_keys", ""))
}
