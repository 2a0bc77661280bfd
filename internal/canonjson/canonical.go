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
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
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
	if max(cap(p.nodes), cap(p.text), cap(p.kids), cap(p.stack), cap(p.sort), cap(p.dig), cap(p.path)) > maxPooledLen {
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
	}
	parsers.Put(p)
}

// Node kinds of the parse tree.
const (
	kindLiteral = iota // number, true, false or null: text is the canonical form
	kindString         // text is the unescaped string, escaped when emitted
	kindArray          // kids are the elements
	kindObject         // kids are key, value, key, value..., sorted by key
)

// node is one value of the parse tree. The tree lives in the parser's flat
// slices and points into them by index, so a document costs a few slice
// growths rather than an allocation per value.
type node struct {
	kind uint8
	// inBody says text is body[start:end]: strings without escapes are not
	// copied. Otherwise text is parser.text[start:end].
	inBody     bool
	start, end int
}

// member is an object member during sorting.
type member struct {
	key, value int
}

// parser is a single-use JSON parser that builds the tree Canonicalize
// emits. It is written by hand rather than on encoding/json so that it can
// reject what encoding/json lets through (invalid UTF-8, lone surrogates,
// duplicate keys), keep number literals exact, and avoid reflection.
type parser struct {
	data  []byte
	pos   int
	nodes []node
	text  []byte // unescaped strings and canonical numbers
	kids  []int  // children of containers, each container's contiguous
	stack []int  // children of the containers still open
	sort  []member
	dig   []byte // scratch for the digits of a number
	// path is where the value being parsed sits, for errors that name it.
	path []step
	// growth is how many bytes the numbers gain written out in plain decimal.
	growth int64
}

// step is one level of parser.path: an object member (key is the key's
// node) or an array element (key is -1).
type step struct {
	key, index int
}

// pathString renders p.path as submission.items[3] (a key that is not an
// identifier is written ["a key"]); "" is the root.
func (p *parser) pathString() string {
	var b []byte
	for _, st := range p.path {
		if st.key < 0 {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(st.index), 10)
			b = append(b, ']')
			continue
		}
		k := p.str(st.key)
		if isIdentifier(k) {
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, k...)
			continue
		}
		b = append(b, '[')
		b = appendString(b, k)
		b = append(b, ']')
	}
	if len(b) == 0 {
		return "the top level"
	}
	return string(b)
}

func isIdentifier(k []byte) bool {
	for i, c := range k {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return len(k) > 0
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, fmt.Sprintf(format, args...), p.pos)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) addNode(n node) int {
	p.nodes = append(p.nodes, n)
	return len(p.nodes) - 1
}

// parseValue parses the value at p.pos (after whitespace) and returns its
// node. depth is the number of containers enclosing it.
func (p *parser) parseValue(depth int) (int, error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return 0, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.parseObject(depth + 1)
	case c == '[':
		return p.parseArray(depth + 1)
	case c == '"':
		return p.parseString()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.parseNumber()
	case c == 't':
		return p.parseWord("true")
	case c == 'f':
		return p.parseWord("false")
	case c == 'n':
		return p.parseWord("null")
	default:
		return 0, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) parseWord(word string) (int, error) {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return 0, p.errorf("invalid literal")
	}
	start := p.pos
	p.pos += len(word)
	// The literal is its own canonical form: point at the body.
	return p.addNode(node{kind: kindLiteral, inBody: true, start: start, end: p.pos}), nil
}

func (p *parser) parseArray(depth int) (int, error) {
	if depth > MaxDepth {
		return 0, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // [
	base := len(p.stack)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for i := 0; ; i++ {
			p.path = append(p.path, step{key: -1, index: i})
			v, err := p.parseValue(depth)
			if err != nil {
				return 0, err
			}
			p.path = p.path[:len(p.path)-1]
			p.stack = append(p.stack, v)
			p.skipSpace()
			if p.pos >= len(p.data) {
				return 0, p.errorf("unexpected end of input in array")
			}
			c := p.data[p.pos]
			p.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				p.pos--
				return 0, p.errorf("expected ',' or ']' in array")
			}
		}
	}
	start := len(p.kids)
	p.kids = append(p.kids, p.stack[base:]...)
	p.stack = p.stack[:base]
	return p.addNode(node{kind: kindArray, start: start, end: len(p.kids)}), nil
}

func (p *parser) parseObject(depth int) (int, error) {
	if depth > MaxDepth {
		return 0, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // {
	base := len(p.stack)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for {
			p.skipSpace()
			if p.pos >= len(p.data) || p.data[p.pos] != '"' {
				return 0, p.errorf("expected string key in object")
			}
			k, err := p.parseString()
			if err != nil {
				return 0, err
			}
			p.skipSpace()
			if p.pos >= len(p.data) || p.data[p.pos] != ':' {
				return 0, p.errorf("expected ':' after object key")
			}
			p.pos++
			p.path = append(p.path, step{key: k})
			v, err := p.parseValue(depth)
			if err != nil {
				return 0, err
			}
			p.path = p.path[:len(p.path)-1]
			p.stack = append(p.stack, k, v)
			p.skipSpace()
			if p.pos >= len(p.data) {
				return 0, p.errorf("unexpected end of input in object")
			}
			c := p.data[p.pos]
			p.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				p.pos--
				return 0, p.errorf("expected ',' or '}' in object")
			}
		}
	}
	if err := p.sortMembers(p.stack[base:]); err != nil {
		return 0, err
	}
	start := len(p.kids)
	p.kids = append(p.kids, p.stack[base:]...)
	p.stack = p.stack[:base]
	return p.addNode(node{kind: kindObject, start: start, end: len(p.kids)}), nil
}

// sortMembers sorts the key, value pairs in kv by key and rejects duplicate
// keys, which I-JSON forbids: parsers disagree on which one wins, so two
// services could read different bodies from the same bytes.
func (p *parser) sortMembers(kv []int) error {
	if len(kv) <= 2 {
		return nil
	}
	sorted := true
	for i := 2; i < len(kv); i += 2 {
		if compareKeys(p.str(kv[i-2]), p.str(kv[i])) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		// Strictly increasing: no duplicates either.
		return nil
	}
	ms := p.sort[:0]
	for i := 0; i < len(kv); i += 2 {
		ms = append(ms, member{key: kv[i], value: kv[i+1]})
	}
	slices.SortFunc(ms, func(a, b member) int {
		return compareKeys(p.str(a.key), p.str(b.key))
	})
	for i, m := range ms {
		if i > 0 && string(p.str(ms[i-1].key)) == string(p.str(m.key)) {
			return p.errorf("duplicate object key %q", p.str(m.key))
		}
		kv[2*i], kv[2*i+1] = m.key, m.value
	}
	p.sort = ms
	return nil
}

// str returns the text of node i without copying. The result must not be
// kept past the next append to p.text.
func (p *parser) str(i int) []byte {
	n := p.nodes[i]
	if n.inBody {
		return p.data[n.start:n.end]
	}
	return p.text[n.start:n.end]
}

// compareKeys orders object keys as RFC 8785 does: by their UTF-16 code
// units. That is the byte order of UTF-8 except that characters above U+FFFF
// (surrogate pairs, D800-DFFF) sort before U+E000-U+FFFF.
func compareKeys(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return int(a[i]) - int(b[i])
	}
	// Back up to the start of the character holding the first difference;
	// the bytes before it are common, so it starts at the same offset in both.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	ua, ub := firstUTF16Unit(ra), firstUTF16Unit(rb)
	if ua != ub {
		return int(ua) - int(ub)
	}
	// Both above U+FFFF with the same high surrogate: the low surrogates
	// order like the code points.
	return int(ra) - int(rb)
}

func firstUTF16Unit(r rune) rune {
	if r >= 0x10000 {
		return 0xd800 + (r-0x10000)>>10
	}
	return r
}

// parseString parses the string at p.pos (a '"') into its unescaped text.
func (p *parser) parseString() (int, error) {
	p.pos++ // "
	start := p.pos
	// Fast path: no escapes, so the text is a slice of the body.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			n := p.addNode(node{kind: kindString, inBody: true, start: start, end: p.pos})
			p.pos++
			return n, nil
		case c == '\\':
			return p.parseEscapedString(start)
		case c < 0x20:
			return 0, p.errorf("control character in string")
		case c < utf8.RuneSelf:
			p.pos++
		default:
			if err := p.skipRune(); err != nil {
				return 0, err
			}
		}
	}
	return 0, p.errorf("unterminated string")
}

// skipRune moves past the multi-byte UTF-8 character at p.pos.
func (p *parser) skipRune() error {
	r, size := utf8.DecodeRune(p.data[p.pos:])
	if r == utf8.RuneError && size <= 1 {
		return p.errorf("invalid UTF-8 in string")
	}
	p.pos += size
	return nil
}

// parseEscapedString continues parseString from the first backslash, copying
// the unescaped text to p.text.
func (p *parser) parseEscapedString(start int) (int, error) {
	textStart := len(p.text)
	p.text = append(p.text, p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return p.addNode(node{kind: kindString, start: textStart, end: len(p.text)}), nil
		case c == '\\':
			if err := p.parseEscape(); err != nil {
				return 0, err
			}
		case c < 0x20:
			return 0, p.errorf("control character in string")
		case c < utf8.RuneSelf:
			p.text = append(p.text, c)
			p.pos++
		default:
			from := p.pos
			if err := p.skipRune(); err != nil {
				return 0, err
			}
			p.text = append(p.text, p.data[from:p.pos]...)
		}
	}
	return 0, p.errorf("unterminated string")
}

// parseEscape decodes the escape sequence at p.pos (a '\') onto p.text.
func (p *parser) parseEscape() error {
	if p.pos+1 >= len(p.data) {
		return p.errorf("unterminated string")
	}
	c := p.data[p.pos+1]
	var b byte
	switch c {
	case '"', '\\', '/':
		b = c
	case 'b':
		b = '\b'
	case 'f':
		b = '\f'
	case 'n':
		b = '\n'
	case 'r':
		b = '\r'
	case 't':
		b = '\t'
	case 'u':
		r, ok := p.hex4(p.pos + 2)
		if !ok {
			return p.errorf("invalid \\u escape")
		}
		p.pos += 6
		if utf8.ValidRune(r) {
			p.text = utf8.AppendRune(p.text, r)
			return nil
		}
		// A surrogate: valid only as a high one followed by an escaped low one.
		if r >= 0xdc00 {
			return p.errorf("lone surrogate in \\u escape")
		}
		if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
			return p.errorf("lone surrogate in \\u escape")
		}
		lo, ok := p.hex4(p.pos + 2)
		if !ok {
			return p.errorf("invalid \\u escape")
		}
		if lo < 0xdc00 || lo > 0xdfff {
			return p.errorf("lone surrogate in \\u escape")
		}
		p.pos += 6
		p.text = utf8.AppendRune(p.text, 0x10000+(r-0xd800)<<10+(lo-0xdc00))
		return nil
	default:
		return p.errorf("invalid escape %q", c)
	}
	p.text = append(p.text, b)
	p.pos += 2
	return nil
}

// hex4 decodes the four hex digits at data[i:].
func (p *parser) hex4(i int) (rune, bool) {
	if len(p.data)-i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// parseNumber parses the number at p.pos, checking the RFC 8259 grammar
//
//	-? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?
//
// and stores its canonical form (see Canonicalize).
func (p *parser) parseNumber() (int, error) {
	d := p.data
	neg := false
	if d[p.pos] == '-' {
		neg = true
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(d) && d[p.pos] == '0':
		p.pos++
	case p.pos < len(d) && d[p.pos] >= '1' && d[p.pos] <= '9':
		p.pos = skipDigits(d, p.pos)
	default:
		return 0, p.errorf("invalid number")
	}
	intDigits := d[intStart:p.pos]
	var fracDigits []byte
	if p.pos < len(d) && d[p.pos] == '.' {
		p.pos++
		from := p.pos
		p.pos = skipDigits(d, p.pos)
		if p.pos == from {
			return 0, p.errorf("invalid number: no digits after '.'")
		}
		fracDigits = d[from:p.pos]
	}
	var exp int64
	if p.pos < len(d) && (d[p.pos] == 'e' || d[p.pos] == 'E') {
		p.pos++
		expNeg := false
		if p.pos < len(d) && (d[p.pos] == '+' || d[p.pos] == '-') {
			expNeg = d[p.pos] == '-'
			p.pos++
		}
		from := p.pos
		p.pos = skipDigits(d, p.pos)
		if p.pos == from {
			return 0, p.errorf("invalid number: no digits in exponent")
		}
		var ok bool
		if exp, ok = parseExponent(d[from:p.pos], expNeg); !ok {
			return 0, p.errorf("number exponent out of range")
		}
	}

	// The value is 0.D * 10^(exp+len(intDigits)) where D is all the digits;
	// with D's leading and trailing zeros removed it is M = d1 d2 ... dn
	// times 10^(x-n+1), x being the exponent in scientific notation.
	digits := append(append(p.dig[:0], intDigits...), fracDigits...)
	p.dig = digits
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	textStart := len(p.text)
	if lead == len(digits) {
		p.text = append(p.text, '0')
		return p.addNode(node{kind: kindLiteral, start: textStart, end: len(p.text)}), nil
	}
	trail := len(digits)
	for digits[trail-1] == '0' {
		trail--
	}
	m := digits[lead:trail]
	adj := int64(len(intDigits) - 1 - lead)
	if (adj > 0 && exp > math.MaxInt64-adj) || (adj < 0 && exp < math.MinInt64-adj) {
		return 0, p.errorf("number exponent out of range")
	}
	plain := plainLength(int64(len(m)), exp+adj)
	if plain > MaxNumberLength {
		return 0, &NumberError{Path: p.pathString(), Length: plain}
	}
	if literal := int64(p.pos - intStart); plain > literal {
		p.growth += plain - literal
	}
	p.text = appendNumber(p.text, neg, m, exp+adj)
	return p.addNode(node{kind: kindLiteral, start: textStart, end: len(p.text)}), nil
}

// plainLength is how many characters the non-zero number d1.d2...dn * 10^x
// takes written out in plain decimal without its sign, as PostgreSQL prints
// numeric: 1e3 is 1000, 1.5 is 1.5, 1e-3 is 0.001. It saturates instead of
// overflowing.
func plainLength(n, x int64) int64 {
	switch {
	case x >= n-1: // an integer
		if x >= math.MaxInt64-1 {
			return math.MaxInt64
		}
		return x + 1
	case x >= 0: // the point falls inside the digits
		return n + 1
	default: // 0.000ddd
		if x <= math.MinInt64+n+2 {
			return math.MaxInt64
		}
		return n + 1 - x
	}
}

func skipDigits(d []byte, i int) int {
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		i++
	}
	return i
}

// parseExponent parses an exponent's decimal digits, which may have any
// number of leading zeros, into an int64.
func parseExponent(digits []byte, neg bool) (int64, bool) {
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	if len(digits) > 19 {
		return 0, false
	}
	var u uint64
	for _, c := range digits {
		u = u*10 + uint64(c-'0') // 19 digits cannot overflow a uint64
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return int64(-u), true // -(1<<63) wraps to MinInt64, as it should
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// appendNumber writes the canonical form of the non-zero number
// (-1)^neg * d1.d2...dn * 10^x, where m holds d1...dn without leading or
// trailing zeros.
func appendNumber(b []byte, neg bool, m []byte, x int64) []byte {
	if neg {
		b = append(b, '-')
	}
	n := int64(len(m))
	switch {
	case x < -6 || x > 20:
		b = append(b, m[0])
		if n > 1 {
			b = append(b, '.')
			b = append(b, m[1:]...)
		}
		b = append(b, 'e')
		if x > 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, x, 10)
	case x >= n-1: // an integer: the digits, then zeros
		b = append(b, m...)
		for range x - (n - 1) {
			b = append(b, '0')
		}
	case x >= 0: // the point falls inside the digits
		b = append(b, m[:x+1]...)
		b = append(b, '.')
		b = append(b, m[x+1:]...)
	default: // 0.000ddd
		b = append(b, '0', '.')
		for range -x - 1 {
			b = append(b, '0')
		}
		b = append(b, m...)
	}
	return b
}

// emit appends the canonical text of node i to b.
func (p *parser) emit(b []byte, i int) []byte {
	n := p.nodes[i]
	switch n.kind {
	case kindLiteral:
		if n.inBody {
			return append(b, p.data[n.start:n.end]...)
		}
		return append(b, p.text[n.start:n.end]...)
	case kindString:
		return appendString(b, p.str(i))
	case kindArray:
		b = append(b, '[')
		for j, k := range p.kids[n.start:n.end] {
			if j > 0 {
				b = append(b, ',')
			}
			b = p.emit(b, k)
		}
		return append(b, ']')
	default: // kindObject
		b = append(b, '{')
		kv := p.kids[n.start:n.end]
		for j := 0; j < len(kv); j += 2 {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendString(b, p.str(kv[j]))
			b = append(b, ':')
			b = p.emit(b, kv[j+1])
		}
		return append(b, '}')
	}
}

// appendString writes s as a JSON string, escaping only what JSON requires.
func appendString(b []byte, s []byte) []byte {
	b = append(b, '"')
	from := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[from:i]...)
		from = i + 1
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	b = append(b, s[from:]...)
	return append(b, '"')
}
