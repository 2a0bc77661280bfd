package apispec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func commonSpec(t *testing.T, responses string) *Value {
	t.Helper()
	v, err := Decode([]byte(`{"paths":{"/x/":{"get":{"responses":`+responses+`}}}}`), true)
	require.NoError(t, err)
	return v
}

// Every response gets X-Request-Id; a response the annotations leave to
// Common gets its description and headers, placed as swag places headers
// (by name); the operation's own header of the same name stays.
func TestExpandCommon(t *testing.T) {
	t.Parallel()
	s := commonSpec(t, `{
		"200":{"description":"OK."},
		"401":{"description":"common:unauthorized","schema":{"$ref":"#/definitions/handlers.ProblemUnauthorized"},
			"headers":{"X-Request-Id":{"type":"string","description":"id"}}},
		"500":{"description":"common:internal","schema":{"$ref":"#/definitions/handlers.ProblemInternal"}},
		"503":{"description":"common:unavailable","schema":{"$ref":"#/definitions/handlers.ProblemUnavailable"},
			"headers":{"Retry-After":{"type":"integer","description":"its own"}}}}`)
	require.NoError(t, ExpandCommon(s))
	r := s.Get("paths").Get("/x/").Get("get").Get("responses")
	rid := `"X-Request-Id":{"type":"string","description":` + string(String(RequestIDHeader.Description).Raw) + `}`
	require.Equal(t, `{"description":"OK.","headers":{`+rid+`}}`, string(r.Get("200").Compact()), "every answer has X-Request-Id")
	www := Common["unauthorized"].Headers[0]
	require.Equal(t, `{"description":`+string(String(Common["unauthorized"].Description).Raw)+
		`,"schema":{"$ref":"#/definitions/handlers.ProblemUnauthorized"},"headers":{"WWW-Authenticate":{"type":"string","description":`+
		string(String(www.Description).Raw)+`},"X-Request-Id":{"type":"string","description":"id"}}}`, string(r.Get("401").Compact()))
	require.Equal(t, Common["internal"].Description, r.Get("500").Get("description").Str())
	require.Equal(t, `{"Retry-After":{"type":"integer","description":"Seconds to wait before retrying."},`+rid+`}`, string(r.Get("500").Get("headers").Compact()))
	require.Equal(t, "its own", r.Get("503").Get("headers").Get("Retry-After").Get("description").Str())
}

// A name that is not in Common, or whose status or schema is another, is
// an error: the spec would otherwise say something the annotation did not mean.
func TestExpandCommonRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ responses, want string }{
		{`{"401":{"description":"common:unauthorised","schema":{"$ref":"#/definitions/handlers.ProblemUnauthorized"}}}`, `no common response "unauthorised"`},
		{`{"403":{"description":"common:unauthorized","schema":{"$ref":"#/definitions/handlers.ProblemUnauthorized"}}}`, `GET /x/ 403: common response "unauthorized" is a 401`},
		{`{"500":{"description":"common:internal","schema":{"$ref":"#/definitions/handlers.ProblemUnavailable"}}}`, `has the schema handlers.ProblemInternal`},
	} {
		require.ErrorContains(t, ExpandCommon(commonSpec(t, tc.responses)), tc.want)
	}
}
