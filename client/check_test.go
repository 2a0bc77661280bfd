package client_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// The module depends on nothing but the standard library, its tests
// included: these few checks stand in for testify's require. Each stops the
// test on failure; msg is an optional format and its arguments.

func failf(t *testing.T, msg []any, format string, args ...any) {
	t.Helper()
	s := fmt.Sprintf(format, args...)
	if len(msg) > 0 {
		if f, ok := msg[0].(string); ok {
			s += ": " + fmt.Sprintf(f, msg[1:]...)
		} else {
			s += ": " + fmt.Sprint(msg...)
		}
	}
	t.Fatal(s)
}

func noError(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err != nil {
		failf(t, msg, "unexpected error: %v", err)
	}
}

func isError(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err == nil {
		failf(t, msg, "want an error, got nil")
	}
}

func equal(t *testing.T, want, got any, msg ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		failf(t, msg, "not equal:\nwant %#v\n got %#v", want, got)
	}
}

func isTrue(t *testing.T, ok bool, msg ...any) {
	t.Helper()
	if !ok {
		failf(t, msg, "want true")
	}
}

func isFalse(t *testing.T, ok bool, msg ...any) {
	t.Helper()
	if ok {
		failf(t, msg, "want false")
	}
}

func errorIs(t *testing.T, err, target error, msg ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		failf(t, msg, "error %v is not %v", err, target)
	}
}

func errorAs(t *testing.T, err error, target any, msg ...any) {
	t.Helper()
	if !errors.As(err, target) {
		failf(t, msg, "error %v (%T) is not a %T", err, err, target)
	}
}

func errorContains(t *testing.T, err error, sub string, msg ...any) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), sub) {
		failf(t, msg, "error %v does not contain %q", err, sub)
	}
}

func contains(t *testing.T, s, sub string, msg ...any) {
	t.Helper()
	if !strings.Contains(s, sub) {
		failf(t, msg, "%q does not contain %q", s, sub)
	}
}

func notContains(t *testing.T, s, sub string, msg ...any) {
	t.Helper()
	if strings.Contains(s, sub) {
		failf(t, msg, "%q contains %q", s, sub)
	}
}

func hasLen[T any](t *testing.T, s []T, n int, msg ...any) {
	t.Helper()
	if len(s) != n {
		failf(t, msg, "want %d elements, got %d: %v", n, len(s), s)
	}
}

// jsonEq: want and got are the same JSON value, whatever their spacing and key order.
func jsonEq(t *testing.T, want, got string, msg ...any) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		failf(t, msg, "want is not JSON: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		failf(t, msg, "got is not JSON (%v): %s", err, got)
	}
	if !reflect.DeepEqual(w, g) {
		failf(t, msg, "JSON not equal:\nwant %s\n got %s", want, got)
	}
}
