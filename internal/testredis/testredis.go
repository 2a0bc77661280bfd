// Package testredis gives tests the Redis they may use: TEST_REDIS_URL, by
// default a private redis-server that `make test` starts under .dev/. Its
// database (9) and databases 10 to 15 of the same server are the tests'.
// Before a test process uses them, Claim checks that each is empty or marked
// as the tests' own, and marks the empty ones: a database holding another
// program's keys stops the tests, which then delete nothing.
package testredis

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is used when TEST_REDIS_URL is not set: the private
// redis-server that scripts/dev-services.sh starts for `make test`.
const DefaultURL = "redis://127.0.0.1:16379/9"

// Marker is the key that marks a database as the tests' own.
const Marker = "valruns-tests:owned"

// FirstFlushed and LastFlushed are the database numbers that tests may
// flush; the database of TEST_REDIS_URL itself is shared and never flushed.
const (
	FirstFlushed = 10
	LastFlushed  = 15
)

// claimScript marks an empty database as the tests' own; it answers 1 when
// the database is (now) the tests', 0 when it holds keys without the marker.
var claimScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
if redis.call('DBSIZE') == 0 then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0`)

var claimed struct {
	once sync.Once
	err  error
}

// URL is TEST_REDIS_URL or DefaultURL, after Claim has checked the tests'
// databases on its server (once per test binary).
func URL(t testing.TB) string {
	t.Helper()
	u, err := claim()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// MustURL is URL for code without a testing.TB (a child's environment); it
// panics when the tests' databases hold other keys.
func MustURL() string {
	u, err := claim()
	if err != nil {
		panic(err)
	}
	return u
}

func claim() (string, error) {
	u := rawURL()
	claimed.once.Do(func() { claimed.err = Claim(context.Background(), u) })
	return u, claimed.err
}

func rawURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Claim checks the database of url and databases FirstFlushed to
// LastFlushed of its server: each must be empty or hold Marker. Empty ones
// get the marker. The error names every database that holds other keys.
func Claim(ctx context.Context, url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("TEST_REDIS_URL %q: %w", url, err)
	}
	dbs := []int{opt.DB}
	for n := FirstFlushed; n <= LastFlushed; n++ {
		if n != opt.DB {
			dbs = append(dbs, n)
		}
	}
	var foreign []string
	for _, n := range dbs {
		o := *opt
		o.DB = n
		o.DialTimeout, o.MaxRetries = 5*time.Second, -1 // a Redis that is not there fails at once
		c := redis.NewClient(&o)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ok, err := claimScript.Run(cctx, c, []string{Marker}, "written by valruns' tests").Int()
		var size int64
		if err == nil && ok == 0 {
			size, err = c.DBSize(cctx).Result()
		}
		cancel()
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("the tests' Redis at %s (TEST_REDIS_URL=%s) does not answer (run `make services`): %w", opt.Addr, url, err)
		}
		if ok == 0 {
			foreign = append(foreign, fmt.Sprintf("database %d holds %d keys", n, size))
		}
	}
	if len(foreign) > 0 {
		return fmt.Errorf("the tests' Redis at %s (TEST_REDIS_URL=%s) holds keys the tests did not write (%v): "+
			"the tests use its database %d and flush %d to %d, so they stop here and delete nothing. "+
			"Unset TEST_REDIS_URL to use the private Redis that `make test` starts under .dev/, "+
			"or name a Redis whose databases %d and %d to %d are empty",
			opt.Addr, url, foreign, opt.DB, FirstFlushed, LastFlushed, opt.DB, FirstFlushed, LastFlushed)
	}
	return nil
}

// Flush empties database opt.DB, which must be one of FirstFlushed to
// LastFlushed, and marks it again as the tests' own, in one transaction.
func Flush(ctx context.Context, c *redis.Client) error {
	if db := c.Options().DB; db < FirstFlushed || db > LastFlushed {
		return fmt.Errorf("tests flush only Redis databases %d to %d, not %d", FirstFlushed, LastFlushed, db)
	}
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.FlushDB(ctx)
		p.Set(ctx, Marker, "written by valruns' tests", 0)
		return nil
	})
	return err
}
