package canonjson

import (
	"math"
	"strconv"
)

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
