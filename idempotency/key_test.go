package idempotency

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	t.Parallel()

	maxKey := strings.Repeat("k", MaxKeyLength)
	over := strings.Repeat("k", MaxKeyLength+1)
	// 255 characters, each escaped in the quoted form: the longest valid
	// quoted value is more than twice MaxKeyLength bytes.
	maxEscaped := strings.Repeat(`\\`, MaxKeyLength)
	huge := strings.Repeat("a", 10<<20)

	tests := []struct {
		name    string
		raw     string
		want    string
		wantErr error
	}{
		{name: "bare", raw: "abc-123", want: "abc-123"},
		{name: "bare uuid", raw: "5c0a4e1f-8a3b-4f5e-9d1c-2b7a6e8f0c12", want: "5c0a4e1f-8a3b-4f5e-9d1c-2b7a6e8f0c12"},
		{name: "quoted is the same key", raw: `"abc-123"`, want: "abc-123"},
		{name: "case-sensitive", raw: "AbC", want: "AbC"},
		{name: "bare with inner space", raw: "a b", want: "a b"},
		{name: "bare with inner quote", raw: `a"b`, want: `a"b`},
		{name: "bare ending in quote", raw: `ab"`, want: `ab"`},
		{name: "bare with backslash", raw: `a\b`, want: `a\b`},
		{name: "quoted escaped quote", raw: `"a\"b"`, want: `a"b`},
		{name: "quoted escaped backslash", raw: `"a\\b"`, want: `a\b`},
		{name: "quoted only escapes", raw: `"\"\\"`, want: `"\`},
		{name: "quoted keeps inner spaces", raw: `" a b "`, want: " a b "},
		{name: "spaces around bare", raw: "  abc  ", want: "abc"},
		{name: "tabs around bare", raw: "\tabc\t", want: "abc"},
		{name: "whitespace around quoted", raw: " \t\"abc\" \t", want: "abc"},
		{name: "single character", raw: "x", want: "x"},
		{name: "bare 255", raw: maxKey, want: maxKey},
		{name: "quoted 255", raw: `"` + maxKey + `"`, want: maxKey},
		{name: "quoted 255 all escaped", raw: `"` + maxEscaped + `"`, want: strings.Repeat(`\`, MaxKeyLength)},
		{name: "bare 255 with whitespace around", raw: "  " + maxKey + "\t", want: maxKey},

		{name: "empty", raw: "", wantErr: ErrKeyInvalid},
		{name: "only whitespace", raw: " \t ", wantErr: ErrKeyInvalid},
		{name: "empty quoted", raw: `""`, wantErr: ErrKeyInvalid},
		{name: "empty quoted with whitespace", raw: ` "" `, wantErr: ErrKeyInvalid},
		{name: "bare 256", raw: over, wantErr: ErrKeyTooLong},
		{name: "quoted 256", raw: `"` + over + `"`, wantErr: ErrKeyTooLong},
		{name: "quoted 256 all escaped", raw: `"` + maxEscaped + `\\"`, wantErr: ErrKeyTooLong},
		{name: "non-ASCII", raw: "clé", wantErr: ErrKeyInvalid},
		{name: "non-ASCII quoted", raw: `"clé"`, wantErr: ErrKeyInvalid},
		{name: "invalid UTF-8", raw: "a\xffb", wantErr: ErrKeyInvalid},
		{name: "control character", raw: "a\x01b", wantErr: ErrKeyInvalid},
		{name: "inner tab", raw: "a\tb", wantErr: ErrKeyInvalid},
		{name: "newline", raw: "a\nb", wantErr: ErrKeyInvalid},
		{name: "DEL", raw: "a\x7fb", wantErr: ErrKeyInvalid},
		{name: "NUL", raw: "a\x00b", wantErr: ErrKeyInvalid},
		{name: "control character quoted", raw: "\"a\x01b\"", wantErr: ErrKeyInvalid},
		{name: "tab inside quotes", raw: "\"a\tb\"", wantErr: ErrKeyInvalid},
		{name: "unterminated quote", raw: `"abc`, wantErr: ErrKeyInvalid},
		{name: "lone quote", raw: `"`, wantErr: ErrKeyInvalid},
		{name: "closing quote escaped", raw: `"abc\"`, wantErr: ErrKeyInvalid},
		{name: "unescaped quote inside", raw: `"a"b"`, wantErr: ErrKeyInvalid},
		{name: "data after closing quote", raw: `"abc"x`, wantErr: ErrKeyInvalid},
		{name: "sf parameters", raw: `"abc";a=1`, wantErr: ErrKeyInvalid},
		{name: "bad escape", raw: `"a\nb"`, wantErr: ErrKeyInvalid},
		{name: "escape at end", raw: `"abc\`, wantErr: ErrKeyInvalid},
		{name: "10 MB bare", raw: huge, wantErr: ErrKeyTooLong},
		{name: "10 MB quoted", raw: `"` + huge + `"`, wantErr: ErrKeyTooLong},
		{name: "10 MB unterminated quote", raw: `"` + huge, wantErr: ErrKeyTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.raw)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func BenchmarkParseKey(b *testing.B) {
	for _, bm := range []struct{ name, raw string }{
		{"bare", "5c0a4e1f-8a3b-4f5e-9d1c-2b7a6e8f0c12"},
		{"quoted", `"5c0a4e1f-8a3b-4f5e-9d1c-2b7a6e8f0c12"`},
		{"10MB", strings.Repeat("a", 10<<20)},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = ParseKey(bm.raw)
			}
		})
	}
}
