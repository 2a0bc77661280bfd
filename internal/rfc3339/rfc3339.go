// Package rfc3339 parses the date-time of RFC 3339 (section 5.6), exactly:
// what a client sends as a time in a query.
//
// Go's time.Parse is both too lax and too strict for that: it takes an
// offset of +24:00, and refuses the lower-case "t" and "z" that RFC 3339
// allows (ABNF strings are case-insensitive) and the leap second 23:59:60.
package rfc3339

import (
	"errors"
	"time"
)

// ErrSyntax: the text is not an RFC 3339 date-time.
var ErrSyntax = errors.New("not an RFC 3339 date-time")

// Parse reads s, a date-time of RFC 3339:
//
//	YYYY-MM-DDThh:mm:ss[.fraction](Z|+hh:mm|-hh:mm)
//
// with "T" and "Z" in either case, a day that exists in its month, hours
// 00-23 (in the time and the offset), minutes 00-59 and seconds 00-60. A
// second of 60 (a leap second) is the instant one second after second 59:
// time.Time has no leap seconds, and that instant is the next one there is.
// A fraction of any length is kept to the nanosecond (truncated). An offset
// of -00:00 (UTC, local offset unknown) is UTC. The time is returned in
// UTC. Anything else, such as a space for "T", a missing offset, or a
// year of other than four digits, is ErrSyntax.
func Parse(s string) (time.Time, error) {
	// 2006-01-02T15:04:05Z is the shortest form.
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':' {
		return time.Time{}, ErrSyntax
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	sec, ok6 := digits(s[17:19])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 ||
		month < 1 || month > 12 || day < 1 || day > daysIn(year, month) ||
		hour > 23 || minute > 59 || sec > 60 {
		return time.Time{}, ErrSyntax
	}
	rest := s[19:]
	nsec := 0
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && isDigit(rest[n]) {
			if n <= 9 {
				nsec = nsec*10 + int(rest[n]-'0')
			}
			n++
		}
		if n == 1 {
			return time.Time{}, ErrSyntax // "." needs a digit
		}
		for i := n; i <= 9; i++ {
			nsec *= 10
		}
		rest = rest[n:]
	}
	offset := 0
	switch {
	case rest == "Z" || rest == "z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, okh := digits(rest[1:3])
		om, okm := digits(rest[4:6])
		if !okh || !okm || oh > 23 || om > 59 {
			return time.Time{}, ErrSyntax
		}
		offset = (oh*60 + om) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, ErrSyntax
	}
	leap := 0
	if sec == 60 {
		sec, leap = 59, 1
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(time.Duration(leap-offset) * time.Second), nil
}

// digits is s, all ASCII digits, as a number.
func digits(s string) (int, bool) {
	n := 0
	for i := range len(s) {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// daysIn is the number of days of month in year (proleptic Gregorian, as
// RFC 3339 and time.Time count).
func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
