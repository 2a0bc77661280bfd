package idempotency

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/canonjson"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()

	canon := func(s string) []byte {
		t.Helper()
		b, err := canonjson.Canonicalize([]byte(s))
		require.NoError(t, err)
		return b
	}
	const path = "/api/notes/8d7e6a64-7c7f-4f8e-9a49-f2f63d1cde8e/"
	body := canon(`{"note":{"a":1,"b":[1,2]},"metadata":{"source":"ci"}}`)
	base := Fingerprint("POST", path, body)

	require.Equal(t, base, Fingerprint("POST", path, body), "deterministic")
	require.Equal(t, base, Fingerprint("POST", path,
		canon(`{ "metadata": {"source": "ci"}, "note": {"b": [1.0, 2], "a": 1} }`)), "key order, whitespace and number form")

	require.NotEqual(t, base, Fingerprint("PUT", path, body), "method")
	require.NotEqual(t, base, Fingerprint("POST", "/api/notes/00000000-0000-0000-0000-000000000000/", body), "path")
	require.NotEqual(t, base, Fingerprint("POST", path,
		canon(`{"note":{"a":2,"b":[1,2]},"metadata":{"source":"ci"}}`)), "body")
	require.NotEqual(t, base, Fingerprint("POST", path, nil), "no body")

	// Length prefixes keep the parts apart: moving bytes from one part to
	// the next must change the hash.
	require.NotEqual(t, Fingerprint("POST", "/a", []byte("b")), Fingerprint("POST", "/ab", nil))
	require.NotEqual(t, Fingerprint("POS", "T/a", nil), Fingerprint("POST", "/a", nil))
	require.NotEqual(t, Fingerprint("", "", []byte("x")), Fingerprint("x", "", nil))

	// No body and an empty body are the same request.
	require.Equal(t, Fingerprint("POST", path, nil), Fingerprint("POST", path, []byte{}))
}

func BenchmarkFingerprint(b *testing.B) {
	canonical, err := canonjson.Canonicalize([]byte(`{"note":{"invoice":{"number":"INV-2024-00042","lines":[{"sku":"SKU-0001","quantity":2,"unit_price":10.5}]}},"metadata":{"source":"ci"}}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint("POST", "/api/notes/8d7e6a64-7c7f-4f8e-9a49-f2f63d1cde8e/", canonical)
	}
}
