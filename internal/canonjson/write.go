package canonjson

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
	case kindText:
		return append(b, p.text[n.start:n.end]...)
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
