// Package clienttest tests the Go client (the module
// github.com/valruns/valruns/client, in client/) against the real service: the
// real router on a fresh PostgreSQL database and Redis, served on loopback.
// The client's own module cannot hold these tests, since it depends on
// nothing but the standard library; its tests use net/http/httptest only.
package clienttest
