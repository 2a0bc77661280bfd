package cli

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/models"
)

// Issue 29: setEnv emptied REDIS_URL, so every command the CLI tests ran
// fell back to REDIS_URL's default, the database `make run` uses (a running
// server logged foreign run ids; foreign organisations appeared in its fair
// gate). The commands of these tests must use TEST_REDIS_URL's database.
//
// Here serve runs as the other tests run it. In TEST_REDIS_URL's database,
// the test spends organisation A's start rate bucket for the next hour: A's
// start is refused 429 only if serve reads that database (on the fallback,
// or with no Redis, it would be created). B starts a run, handed off to the
// queue. When the fallback database answers (and is not TEST_REDIS_URL's),
// a sentinel key put there first is still there, and no key there names A,
// B or B's run.
func TestCommandsUseTheTestsRedis(t *testing.T) {
	db := migratedDB(t)
	ctx := context.Background()
	testOpt, err := redis.ParseURL(proctest.RedisURL())
	require.NoError(t, err, "TEST_REDIS_URL")
	tests := redis.NewClient(testOpt)
	t.Cleanup(func() { _ = tests.Close() })

	defaults, err := config.Load(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	fallbackOpt, err := redis.ParseURL(defaults.RedisURL)
	require.NoError(t, err, "REDIS_URL's default")
	var fallback *redis.Client
	sentinel := "valruns-test-sentinel:" + uuid.NewString()
	if fallbackOpt.Addr == testOpt.Addr && fallbackOpt.DB == testOpt.DB {
		t.Logf("TEST_REDIS_URL is REDIS_URL's default (%s): only the refusal proves the database", defaults.RedisURL)
	} else {
		fallbackOpt.DialTimeout = 2 * time.Second
		fallback = redis.NewClient(fallbackOpt)
		t.Cleanup(func() { _ = fallback.Close() })
		if err := fallback.Set(ctx, sentinel, "left alone", 10*time.Minute).Err(); err != nil {
			t.Logf("the fallback %s does not answer (%v): only the refusal proves the database", defaults.RedisURL, err)
			fallback = nil
		} else {
			t.Cleanup(func() { _ = fallback.Del(context.Background(), sentinel).Err() })
		}
	}

	t.Setenv("ORG_START_RATE", "") // the documented default: the limit is on
	base := serveInProcess(t)
	orgs := map[string]string{} // slug -> id
	tokens := map[string]string{}
	for _, slug := range []string{"a", "b"} {
		r := runCLI(t, "org", "create", "Org "+slug, "--slug", slug)
		require.Equal(t, 0, r.code, r.stderr)
		_, id, ok := strings.Cut(strings.TrimSpace(r.stdout), " id=")
		require.True(t, ok, r.stdout)
		orgs[slug] = id
		r = runCLI(t, "token", "create", "--org", slug)
		require.Equal(t, 0, r.code, r.stderr)
		tokens[slug] = strings.TrimSpace(r.stdout)
	}
	workflow := func(slug string) string {
		t.Helper()
		code, body := call(t, http.MethodPost, base+"/api/workflows/", tokens[slug], `{"name":"w"}`)
		require.Equal(t, http.StatusCreated, code, body)
		return strings.Split(strings.SplitN(body, `"id":"`, 2)[1], `"`)[0]
	}
	wfA, wfB := workflow("a"), workflow("b")

	// redis_rate's GCRA bucket: the time (seconds since 2017) at which it
	// is full again. An hour from now: no start of A passes meanwhile.
	bucket := "rate:valruns:start:" + orgs["a"]
	tat, err := tests.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, tests.Set(ctx, bucket, fmt.Sprint(tat.Unix()-1483228800+3600), 10*time.Minute).Err())
	t.Cleanup(func() { _ = tests.Del(context.Background(), bucket).Err() })

	code, body := call(t, http.MethodPost, base+"/api/workflows/"+wfA+"/start/", tokens["a"], `{"submission":{}}`)
	require.Equal(t, http.StatusTooManyRequests, code, "serve reads its rate buckets in TEST_REDIS_URL's database: %s", body)
	require.Contains(t, body, `"code":"rate_limited"`)

	code, body = call(t, http.MethodPost, base+"/api/workflows/"+wfB+"/start/", tokens["b"], `{"submission":{}}`)
	require.Equal(t, http.StatusCreated, code, body)
	var run models.ValidationRun
	require.NoError(t, db.Where("org_id = ?", orgs["b"]).Take(&run).Error)

	if fallback == nil {
		return
	}
	v, err := fallback.Get(ctx, sentinel).Result()
	require.NoError(t, err, "the sentinel in %s is gone", defaults.RedisURL)
	require.Equal(t, "left alone", v)
	for _, id := range []string{orgs["a"], orgs["b"], run.ID} {
		require.Empty(t, namesOf(t, fallback, id), "in %s, REDIS_URL's default", defaults.RedisURL)
	}
}

// namesOf lists what in rdb's database names id: keys, and members or fields
// of the fair gate's sets and hashes (valruns:*).
func namesOf(t *testing.T, rdb *redis.Client, id string) []string {
	t.Helper()
	ctx := context.Background()
	var found []string
	it := rdb.Scan(ctx, 0, "*"+id+"*", 1000).Iterator()
	for it.Next(ctx) {
		found = append(found, "key "+it.Val())
	}
	require.NoError(t, it.Err())
	it = rdb.Scan(ctx, 0, "valruns:*", 1000).Iterator()
	for it.Next(ctx) {
		key := it.Val()
		typ, err := rdb.Type(ctx, key).Result()
		require.NoError(t, err)
		var in bool
		switch typ {
		case "hash":
			in, err = rdb.HExists(ctx, key, id).Result()
		case "zset":
			err = rdb.ZScore(ctx, key, id).Err()
			in = err == nil
			if err == redis.Nil {
				err = nil
			}
		case "set":
			in, err = rdb.SIsMember(ctx, key, id).Result()
		}
		require.NoError(t, err, key)
		if in {
			found = append(found, typ+" "+key)
		}
	}
	require.NoError(t, it.Err())
	return found
}
