// Package canonjson writes a JSON document in one canonical form, so that two
// bodies that mean the same compare equal byte for byte: the idempotency
// wrapper fingerprints a request by its canonical body, and a retry that
// reorders keys, re-indents or writes 1.0 for 1 is still the same request.
//
// The rules (Canonicalize has them in full): RFC 8785 (JCS) for whitespace,
// member order (keys compared as UTF-16 code units) and string escapes; numbers
// by exact decimal value, never rounded through float64, written in
// ECMAScript's Number.prototype.toString form over their exact digits; I-JSON
// (RFC 7493) enforced, so invalid UTF-8, escaped lone surrogates and duplicate
// keys are refused; nesting bounded by MaxDepth and numbers by MaxNumberLength
// in plain decimal, the way PostgreSQL stores them. Numbers of at most 15
// significant digits within float64's normal range come out exactly as RFC
// 8785 writes them (a differential fuzz test checks it against an RFC 8785
// implementation); beyond that RFC 8785 rounds and this does not.
package canonjson

import (
	"errors"
	"fmt"
	"sync"
)

// MaxDepth is how deeply arrays and objects may nest in a body that is
// canonicalized: [] is depth 1, [[]] depth 2. Real submissions stay in the
// tens; the limit keeps the parser's recursion, and so its stack, bounded
// whatever a client sends (encoding/json allows 10000, more than any API
// body needs).
const MaxDepth = 1000

// MaxNumberLength is the longest a number may be when written out in plain
// decimal, as PostgreSQL stores and prints it (numeric and jsonb never use
// an exponent): 1e300 is 301 characters, 1e-300 is 302. A longer number is
// refused, however short its literal: 1e1000000 and 1e-1000000 are beyond
// what PostgreSQL can hold at all, and 1e131071 (9 bytes) would be stored,
// and answered, as 131072 digits.
const MaxNumberLength = 256

// ErrInvalidJSON reports a body that Canonicalize rejects. It is wrapped with
// the reason and the byte offset.
var ErrInvalidJSON = errors.New("invalid JSON")

// NumberError reports a number of the body that is valid JSON but that the
// service refuses: written out in plain decimal it would be longer than
// MaxNumberLength characters.
type NumberError struct {
	// Path locates the number in the body, such as submission.items[3].
	Path string
	// Length is how many characters it takes in plain decimal (without sign).
	Length int64
}

func (e *NumberError) Error() string {
	return fmt.Sprintf("the number at %s is %d digits long written out in decimal (as it would be stored); at most %d are accepted",
		e.Path, e.Length, MaxNumberLength)
}

// SizeError reports a body that would grow past a limit once its numbers are
// written out in plain decimal, as the database stores them and answers
// repeat them (see CanonicalizeBounded).
type SizeError struct {
	// Size is the body's size in bytes with every number in plain decimal.
	Size int64
	// Limit is the most that was allowed.
	Limit int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("with its numbers written out in decimal (as they are stored), the body is %d bytes, over the limit of %d", e.Size, e.Limit)
}

// Canonicalize returns the canonical form of a JSON document, so that bodies
// that mean the same compare equal byte for byte. It follows RFC 8785 (JCS)
// except for numbers, which are compared by exact decimal value instead of
// through float64:
//
//   - no insignificant whitespace;
//   - object members sorted by key, comparing keys as UTF-16 code units;
//   - strings written one way: only '"', '\' and control characters are
//     escaped (\b \t \n \f \r, otherwise \u00xx with lower-case hex); HTML
//     characters, U+2028/U+2029 and all other non-ASCII text are written as
//     raw UTF-8, so "\u00e9" and "é" are equal;
//   - numbers by value, with no rounding ever: 1, 1.0, 10e-1 and 0.1e1 are
//     all 1; -0 is 0; 12345678901234567890 and 12345678901234567891 stay
//     different. The form is that of ECMAScript's Number.prototype.toString,
//     which RFC 8785 uses, applied to the exact digits: plain decimal when
//     1e-6 <= |v| < 1e21 (100, 0.5, 0.000001, 123000000000000000000), else
//     one digit, the remaining digits after a point, and a signed exponent
//     (1e+21, 1.5e-7, -2.25e+400). So a number is never written more than
//     about 20 bytes longer than its literal, whatever its exponent, and any
//     exponent that fits in an int64 is accepted.
//
// Numbers of at most 15 significant digits within float64's normal range come
// out exactly as RFC 8785 writes them; beyond that RFC 8785 would round and
// this does not. The service only compares its own fingerprints, so it never
// needs to match another implementation byte for byte.
//
// An empty or all-whitespace body means "no body": Canonicalize returns
// (nil, nil). Otherwise the error wraps ErrInvalidJSON when the body is not
// one JSON value (RFC 8259) optionally surrounded by whitespace, or when it is
// not I-JSON (RFC 7493), which RFC 8785 requires: invalid UTF-8, an escaped
// lone surrogate, or a duplicate object key (after unescaping). Nesting deeper
// than MaxDepth and a number whose exponent does not fit in an int64 are
// rejected too. A number longer than MaxNumberLength in plain decimal is a
// *NumberError naming its path.
func Canonicalize(body []byte) ([]byte, error) { return CanonicalizeBounded(body, 0) }

// CanonicalizeBounded is Canonicalize that also refuses, with a *SizeError,
// a body that would be larger than maxPlain bytes with every number written
// out in plain decimal, as the database stores it (0: no limit). Numbers
// may each be up to MaxNumberLength long, so a short body of short literals
// (1e250) could otherwise grow fifty-fold on its way to the database and
// back in the answer.
func CanonicalizeBounded(body []byte, maxPlain int64) ([]byte, error) {
	p := getParser(body)
	defer putParser(p)
	if cap(p.text) < len(body) {
		// Room for the body's text once: an array of scalars is mostly
		// text (parseScalarElement), and growing it by appends would
		// allocate it several times over.
		p.text = make([]byte, 0, len(body))
	}
	p.skipSpace()
	if p.pos == len(p.data) {
		return nil, nil
	}
	root, err := p.parseValue(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.errorf("data after the top-level value")
	}
	if plain := int64(len(body)) + p.growth; maxPlain > 0 && plain > maxPlain {
		return nil, &SizeError{Size: plain, Limit: maxPlain}
	}
	out := make([]byte, 0, len(body))
	return p.emit(out, root), nil
}

// parsers recycles the parse tree's slices: Canonicalize runs on every
// idempotent request, and growing them afresh each time cost more than the
// parsing itself.
var parsers = sync.Pool{New: func() any { return new(parser) }}

// maxPooledLen caps the length of each slice a pooled parser keeps, so that
// one huge body does not pin its tree for the life of the process. Bodies
// of tens of kilobytes stay under it.
const maxPooledLen = 16 << 10

func getParser(body []byte) *parser {
	p := parsers.Get().(*parser)
	p.data = body
	p.pos = 0
	return p
}

func putParser(p *parser) {
	if max(cap(p.nodes), cap(p.text), cap(p.kids), cap(p.stack), cap(p.sort), cap(p.dig), cap(p.path), cap(p.scratch)) > maxPooledLen {
		return
	}
	*p = parser{
		nodes: p.nodes[:0],
		text:  p.text[:0],
		kids:  p.kids[:0],
		stack: p.stack[:0],
		sort:  p.sort[:0],
		dig:   p.dig[:0],
		path:  p.path[:0],

		scratch: p.scratch[:0],
	}
	parsers.Put(p)
}
