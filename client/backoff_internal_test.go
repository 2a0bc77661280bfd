package client

import (
	"net/http"
	"testing"
	"time"
)

// TestBackoffBounds: full jitter stays under min(max, base*2^(n-1)), grows
// with the attempt until the cap, and a Retry-After is a floor, capped.
// (These are computed waits, not measured time.)
func TestBackoffBounds(t *testing.T) {
	c := New("http://x", "", WithBackoff(100*time.Millisecond, time.Second), WithMaxRetryAfter(5*time.Second))
	ceil := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for attempt := 1; attempt <= 70; attempt++ {
		want := time.Second
		if attempt <= len(ceil) {
			want = ceil[attempt-1] * time.Millisecond
		}
		var top time.Duration
		for range 2000 {
			d := c.backoff(attempt, 0, false)
			if d < 0 || d >= want {
				t.Fatalf("attempt %d: wait %s outside [0, %s)", attempt, d, want)
			}
			top = max(top, d)
		}
		if top < want/2 {
			t.Fatalf("attempt %d: 2000 draws never above %s: not spread over [0, %s)", attempt, top, want)
		}
	}
	for range 1000 {
		if d := c.backoff(1, 2*time.Second, true); d < 2*time.Second || d >= 2*time.Second+100*time.Millisecond {
			t.Fatalf("Retry-After 2s: wait %s", d)
		}
		if d := c.backoff(1, time.Hour, true); d < 5*time.Second || d >= 5*time.Second+100*time.Millisecond {
			t.Fatalf("Retry-After 1h capped at 5s: wait %s", d)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999999999999", 0, false},
		{"9999999999", (1 << 20) * time.Second, true},
		{now.Add(3 * time.Second).Format(http.TimeFormat), 3 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"Sun, 22 Nov 2026 10:00:07 GMT", 7 * time.Second, true},
	}
	for _, tt := range tests {
		got, ok := parseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
