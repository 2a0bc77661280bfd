// Package idempotency makes POST handlers idempotent: a generic Gin wrapper
// that honours an Idempotency-Key header the way Stripe does, so that any
// number of client retries execute the handler once and get back the
// original response.
//
// The package holds the pieces of that wrapper: parsing the key (ParseKey),
// the request fingerprint over the method, the path and the canonical JSON
// body (Fingerprint, over internal/canonjson's form), one transaction per
// request holding the key's lock, and the replay of a stored response. It
// knows nothing about the routes it protects, nor about the database: it
// defines the Store it needs (a key's row, a transaction that commits the
// work with it), and a service implements it.
package idempotency

import "errors"

// MaxKeyLength is the longest key accepted, in characters (bytes, since a key
// is ASCII), counted after the quoted form has been unquoted.
const MaxKeyLength = 255

var (
	// ErrKeyInvalid reports a key that is empty, holds a byte outside
	// printable ASCII, or is a malformed quoted string.
	ErrKeyInvalid = errors.New("idempotency key invalid")
	// ErrKeyTooLong reports a key longer than MaxKeyLength characters.
	ErrKeyTooLong = errors.New("idempotency key too long")
)

// ParseKey parses the value of an Idempotency-Key header and returns the key.
//
// Two forms name the same key, so that clients following either convention
// interoperate: Stripe's bare token (abc) and the IETF draft's Structured
// Field string ("abc", RFC 8941 sf-string, where \" and \\ are the only
// escapes). Both return abc. Optional whitespace around the value is ignored
// as HTTP does; whitespace inside a quoted string belongs to the key. Keys are
// case-sensitive.
//
// Errors are reported in scan order, and the scan stops as soon as the key is
// known to be longer than MaxKeyLength, so an overlong value costs O(1) for the
// bare form and at most about 2*MaxKeyLength bytes for the quoted form, however
// long the header is; such a value is ErrKeyTooLong even if bad bytes follow.
func ParseKey(raw string) (string, error) {
	s := trimOWS(raw)
	if s == "" {
		return "", ErrKeyInvalid
	}
	if s[0] == '"' {
		return parseQuotedKey(s)
	}
	if len(s) > MaxKeyLength {
		return "", ErrKeyTooLong
	}
	for i := 0; i < len(s); i++ {
		if !isPrintableASCII(s[i]) {
			return "", ErrKeyInvalid
		}
	}
	return s, nil
}

// parseQuotedKey parses s, which starts with a double quote, as a complete
// RFC 8941 sf-string. Anything after the closing quote (such as sf
// parameters) is rejected: the key must be the whole header value.
func parseQuotedKey(s string) (string, error) {
	// Most keys have no escapes; then the key is a substring of s and
	// nothing is allocated.
	var buf []byte
	n := 0 // length of the key so far
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			if i != len(s)-1 {
				return "", ErrKeyInvalid
			}
			if n == 0 {
				return "", ErrKeyInvalid
			}
			if buf == nil {
				return s[1:i], nil
			}
			return string(buf), nil
		case c == '\\':
			if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", ErrKeyInvalid
			}
			if buf == nil {
				buf = make([]byte, 0, MaxKeyLength)
				buf = append(buf, s[1:i]...)
			}
			i++
			c = s[i]
		case !isPrintableASCII(c):
			return "", ErrKeyInvalid
		}
		if buf != nil {
			buf = append(buf, c)
		}
		n++
		if n > MaxKeyLength {
			return "", ErrKeyTooLong
		}
	}
	// No closing quote.
	return "", ErrKeyInvalid
}

// trimOWS removes the optional whitespace (SP and HTAB, RFC 9110 section 5.6.3)
// that may surround a field value.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// isPrintableASCII reports whether c is in 0x20-0x7E: the visible ASCII
// characters and space, the only bytes a key may hold.
func isPrintableASCII(c byte) bool {
	return c >= 0x20 && c <= 0x7e
}
