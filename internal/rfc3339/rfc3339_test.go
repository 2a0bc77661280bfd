package rfc3339_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/rfc3339"
)

func TestParse(t *testing.T) {
	t.Parallel()
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	valid := []struct {
		in   string
		want time.Time
	}{
		{"2026-11-22T10:00:00Z", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22t10:00:00z", utc(2026, 11, 22, 10, 0, 0, 0)}, // ABNF strings are case-insensitive
		{"2026-11-22t10:00:00Z", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22T10:00:00z", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22T10:00:00+00:00", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22T10:00:00-00:00", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22T11:30:00+01:30", utc(2026, 11, 22, 10, 0, 0, 0)},
		{"2026-11-22T00:00:00-23:59", utc(2026, 11, 22, 23, 59, 0, 0)},
		{"2026-11-22T23:59:00+23:59", utc(2026, 11, 22, 0, 0, 0, 0)},
		{"2026-11-22T10:00:00.5Z", utc(2026, 11, 22, 10, 0, 0, 500_000_000)},
		{"2026-11-22T10:00:00.123456Z", utc(2026, 11, 22, 10, 0, 0, 123_456_000)},
		{"2026-11-22T10:00:00.123456789Z", utc(2026, 11, 22, 10, 0, 0, 123_456_789)},
		{"2026-11-22T10:00:00.1234567899999Z", utc(2026, 11, 22, 10, 0, 0, 123_456_789)}, // truncated
		{"2026-11-22T10:00:00.000Z", utc(2026, 11, 22, 10, 0, 0, 0)},
		// A leap second is the instant after second 59.
		{"2016-12-31T23:59:60Z", utc(2017, 1, 1, 0, 0, 0, 0)},
		{"2016-12-31T23:59:60.25Z", utc(2017, 1, 1, 0, 0, 0, 250_000_000)},
		{"1990-12-31T15:59:60-08:00", utc(1991, 1, 1, 0, 0, 0, 0)}, // RFC 3339's own example
		{"2024-02-29T00:00:00Z", utc(2024, 2, 29, 0, 0, 0, 0)},
		{"2000-02-29T00:00:00Z", utc(2000, 2, 29, 0, 0, 0, 0)},
		{"0000-02-29T00:00:00Z", utc(0, 2, 29, 0, 0, 0, 0)},
		{"0001-01-01T00:00:00Z", time.Time{}},
		{"0000-01-01T00:00:00Z", utc(0, 1, 1, 0, 0, 0, 0)},
		{"9999-12-31T23:59:59.999999999Z", utc(9999, 12, 31, 23, 59, 59, 999_999_999)},
		{"9999-12-31T23:59:60Z", utc(10000, 1, 1, 0, 0, 0, 0)},
		{"2026-04-30T00:00:00Z", utc(2026, 4, 30, 0, 0, 0, 0)},
	}
	for _, tt := range valid {
		got, err := rfc3339.Parse(tt.in)
		require.NoError(t, err, "%q", tt.in)
		require.True(t, tt.want.Equal(got), "%q: got %v, want %v", tt.in, got, tt.want)
		require.Equal(t, time.UTC, got.Location(), "%q", tt.in)
	}

	invalid := []string{
		"",
		"2026-11-22",
		"2026-11-22T10:00:00",  // no offset
		"2026-11-22T10:00Z",    // no seconds
		"2026-11-22 10:00:00Z", // a space for T
		"2026-11-22_10:00:00Z",
		"2026-11-22TT10:00:00Z",
		"20261122T100000Z",         // ISO 8601 basic
		"2026-11-22T10:00:00+0100", // no colon in the offset
		"2026-11-22T10:00:00+01",
		"2026-11-22T10:00:00+1:00",
		"2026-11-22T10:00:00+01:00:00",
		"2026-11-22T10:00:00+24:00", // offset hours are 00-23
		"2026-11-22T10:00:00-24:00",
		"2026-11-22T10:00:00+99:00",
		"2026-11-22T10:00:00+01:60", // offset minutes are 00-59
		"2026-11-22T10:00:00 01:00", // a "+" the query string turned into a space
		"2026-11-22T10:00:00UTC",
		"2026-11-22T10:00:00ZZ",
		"2026-11-22T10:00:00Z ",
		" 2026-11-22T10:00:00Z",
		"2026-11-22T10:00:00.Z",  // a fraction needs a digit
		"2026-11-22T10:00:00,5Z", // a comma is ISO 8601's, not RFC 3339's
		"2026-11-22T10:00:00.5.5Z",
		"2026-11-22T24:00:00Z", // hours are 00-23
		"2026-11-22T10:60:00Z", // minutes are 00-59
		"2026-11-22T10:00:61Z", // seconds are 00-60
		"2026-11-22T10:00:99Z",
		"2026-00-22T10:00:00Z",
		"2026-13-22T10:00:00Z",
		"2026-11-00T10:00:00Z",
		"2026-11-31T10:00:00Z",  // November has 30 days
		"2026-02-29T10:00:00Z",  // 2026 is not a leap year
		"1900-02-29T10:00:00Z",  // neither is 1900
		"10000-01-01T00:00:00Z", // four-digit years
		"+2026-11-22T10:00:00Z",
		"-2026-11-22T10:00:00Z",
		"226-11-22T10:00:00Z",
		"2026-1-22T10:00:00Z",
		"2026-11-2T10:00:00Z",
		"2026-11-22T1:00:00Z",
		"2026-11-22T10:0:00Z",
		"2026-11-22T10:00:0Z",
		"2026-11-22T10:00:00.5",
		"2026-11-22T10:00:00+01:00Z",
		"２０２６-11-22T10:00:00Z", // full-width digits
		"2026-11-22T10:00:00\x00",
		"2026-11-22T-1:00:00Z",
		"2026-11-22T10:00:00+-1:00",
		"now",
		strings.Repeat("9", 40),
	}
	for _, in := range invalid {
		got, err := rfc3339.Parse(in)
		require.ErrorIs(t, err, rfc3339.ErrSyntax, "%q: got %v", in, got)
	}
}

// Parse never panics; what it accepts is a time Go formats back in RFC
// 3339 and reads back as the same instant; and where Go's own parser can
// compare (upper-case "T" and "Z", no leap second, at most nine digits of
// fraction), it agrees with it.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"2026-11-22T10:00:00Z", "2026-11-22t10:00:00z", "2026-11-22T10:00:00.123456789+01:30",
		"2016-12-31T23:59:60Z", "2026-11-22T10:00:00+24:00", "0000-01-01T00:00:00-23:59",
		"9999-12-31T23:59:60.999999999Z", "2026-02-29T00:00:00Z", "2026-11-22T10:00:00.Z",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := rfc3339.Parse(s)
		if err != nil {
			require.ErrorIs(t, err, rfc3339.ErrSyntax)
			require.True(t, got.IsZero())
			return
		}
		again, err := rfc3339.Parse(got.Format(time.RFC3339Nano))
		if got.Year() <= 9999 && got.Year() >= 0 {
			require.NoError(t, err, "%q read as %v", s, got)
			require.True(t, got.Equal(again), "%q read as %v, its format as %v", s, got, again)
		}
		frac := 0 // digits of the fraction
		if i := strings.IndexByte(s, '.'); i >= 0 {
			for frac < len(s)-i-1 && '0' <= s[i+1+frac] && s[i+1+frac] <= '9' {
				frac++
			}
		}
		if strings.ContainsAny(s, "tz") || s[17:19] == "60" || frac > 9 {
			return
		}
		want, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err, "%q: Go's parser refuses what Parse takes", s)
		require.True(t, want.Equal(got), "%q: got %v, Go reads %v", s, got, want)
	})
}
