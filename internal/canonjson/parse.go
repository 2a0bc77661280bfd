package canonjson

import (
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Node kinds of the parse tree.
const (
	kindLiteral = iota // number, true, false or null: text is the canonical form
	kindString         // text is the unescaped string, escaped when emitted
	kindArray          // kids are the elements
	kindObject         // kids are key, value, key, value..., sorted by key
	kindText           // array elements written out already, comma-separated, in text
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
	// scratch holds a string element while it is escaped (parseScalarElement).
	scratch []byte
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

// separator reads what follows a container's element: a comma (false) or
// the container's closing byte (true); in names the container for errors.
func (p *parser) separator(closing byte, in string) (bool, error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return false, p.errorf("unexpected end of input in %s", in)
	}
	switch p.data[p.pos] {
	case closing:
		p.pos++
		return true, nil
	case ',':
		p.pos++
		return false, nil
	}
	return false, p.errorf("expected ',' or '%c' in %s", closing, in)
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
		run := -1 // the node of the scalars just parsed, written as one text
		for i := 0; ; i++ {
			p.path = append(p.path, step{key: -1, index: i})
			p.skipSpace()
			if p.pos < len(p.data) && p.data[p.pos] != '[' && p.data[p.pos] != '{' {
				r, err := p.parseScalarElement(depth, run)
				if err != nil {
					return 0, err
				}
				if r != run {
					p.stack = append(p.stack, r)
					run = r
				}
			} else {
				v, err := p.parseValue(depth)
				if err != nil {
					return 0, err
				}
				p.stack = append(p.stack, v)
				run = -1
			}
			p.path = p.path[:len(p.path)-1]
			closed, err := p.separator(']', "array")
			if err != nil {
				return 0, err
			}
			if closed {
				break
			}
		}
	}
	start := len(p.kids)
	p.kids = append(p.kids, p.stack[base:]...)
	p.stack = p.stack[:base]
	return p.addNode(node{kind: kindArray, start: start, end: len(p.kids)}), nil
}

// parseScalarElement parses an array element that is no container and
// writes its canonical text onto run, the node of the array's scalars just
// before it (-1: none), or a new one. It returns the node that holds it.
// An array of many numbers or strings then costs its text, not a node and
// a kid per element (an array of 500,000 numbers took tens of megabytes).
func (p *parser) parseScalarElement(depth, run int) (int, error) {
	joined := run >= 0 && p.nodes[run].end == len(p.text) // run's text is last: extend it
	if joined {
		p.text = append(p.text, ',')
	}
	from := len(p.text)
	v, err := p.parseValue(depth)
	if err != nil {
		return 0, err
	}
	switch n := p.nodes[v]; {
	case n.kind == kindString:
		p.scratch = appendString(p.scratch[:0], p.str(v))
		p.text = append(p.text[:from], p.scratch...)
	case n.inBody:
		p.text = append(p.text, p.data[n.start:n.end]...)
	default: // a number, written out in p.text already
		p.text = append(p.text[:from], p.text[n.start:n.end]...)
	}
	p.nodes = p.nodes[:v]
	if joined {
		p.nodes[run].end = len(p.text)
		return run, nil
	}
	return p.addNode(node{kind: kindText, start: from, end: len(p.text)}), nil
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
			closed, err := p.separator('}', "object")
			if err != nil {
				return 0, err
			}
			if closed {
				break
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
