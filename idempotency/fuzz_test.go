package idempotency

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// More seeds live in testdata/fuzz/FuzzParseKey, including every crasher the
// fuzzer has found.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		"abc",
		`"abc"`,
		`"a\"b\\c"`,
		" \tabc\t ",
		`""`,
		"",
		`"`,
		`"abc`,
		`"a\nb"`,
		`"abc";p=1`,
		"a\x00b",
		"clé",
		strings.Repeat("k", MaxKeyLength),
		strings.Repeat("k", MaxKeyLength+1),
		`"` + strings.Repeat(`\\`, MaxKeyLength) + `"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := ParseKey(raw)
		if err != nil {
			require.True(t, errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrKeyTooLong), "unexpected error %v", err)
			require.Empty(t, key)
		} else {
			requireWellFormedKey(t, key)
			// Every key survives the quoted form, and the bare form when it
			// can be written bare.
			got, err := ParseKey(sfQuote(key))
			require.NoError(t, err)
			require.Equal(t, key, got)
			if isBareKey(key) {
				got, err := ParseKey(key)
				require.NoError(t, err)
				require.Equal(t, key, got)
			}
		}

		// raw itself as a candidate key: its bare and quoted forms, with
		// optional whitespace around, are that same key.
		if isBareKey(raw) {
			require.Equal(t, raw, key)
			for _, form := range []string{sfQuote(raw), " \t" + raw + "\t ", "\t" + sfQuote(raw) + " "} {
				got, err := ParseKey(form)
				require.NoError(t, err, "%q", form)
				require.Equal(t, raw, got, "%q", form)
			}
		}
		if isBarePrintable(raw) && len(raw) > MaxKeyLength {
			require.ErrorIs(t, err, ErrKeyTooLong)
			_, err := ParseKey(sfQuote(raw))
			require.ErrorIs(t, err, ErrKeyTooLong)
		}
	})
}

// requireWellFormedKey checks what every key ParseKey returns must be.
func requireWellFormedKey(t *testing.T, key string) {
	t.Helper()
	require.GreaterOrEqual(t, len(key), 1)
	require.LessOrEqual(t, len(key), MaxKeyLength)
	for i := 0; i < len(key); i++ {
		require.True(t, key[i] >= 0x20 && key[i] <= 0x7e, "byte %#x at %d in %q", key[i], i, key)
	}
}

// isBarePrintable reports whether s, written bare, is printable ASCII that
// ParseKey cannot mistake for whitespace around a value or a quoted form.
func isBarePrintable(s string) bool {
	if s == "" || s[0] == '"' || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// isBareKey reports whether s is a valid key that can be sent in bare form.
func isBareKey(s string) bool {
	return isBarePrintable(s) && len(s) <= MaxKeyLength
}

// sfQuote writes key as an RFC 8941 sf-string, the IETF draft's form.
func sfQuote(key string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
