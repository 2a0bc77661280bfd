package canonjson

import "unicode/utf8"

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
