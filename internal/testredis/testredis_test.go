package testredis_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testredis"
)

// privateRedis starts a redis-server of the test's own and returns its address.
func privateRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (make test installs it)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		require.True(t, time.Now().Before(deadline), "redis-server on %s never answered", addr)
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}

func client(t *testing.T, addr string, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DB: db})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Another program's key in any of the tests' databases stops the tests,
// and survives: the shared database (9) and one they would flush (12).
func TestClaimLeavesAnotherProgramsKeys(t *testing.T) {
	ctx := context.Background()
	for _, db := range []int{9, 12} {
		t.Run(fmt.Sprintf("db%d", db), func(t *testing.T) {
			addr := privateRedis(t)
			url := fmt.Sprintf("redis://%s/9", addr)
			other := client(t, addr, db)
			require.NoError(t, other.Set(ctx, "asynq:{default}:t:other-app", "a task of another application", 0).Err())

			err := testredis.Claim(ctx, url)
			require.Error(t, err)
			require.Contains(t, err.Error(), fmt.Sprintf("database %d holds 1 keys", db))
			require.Contains(t, err.Error(), "delete nothing")

			v, err := other.Get(ctx, "asynq:{default}:t:other-app").Result()
			require.NoError(t, err, "the other program's key is gone")
			require.Equal(t, "a task of another application", v)
			require.Equal(t, int64(0), other.Exists(ctx, testredis.Marker).Val(), "a foreign database is not marked")
		})
	}
}

// Empty databases are claimed; a claimed one stays the tests' after a
// flush, and a later test process may claim them again.
func TestClaimMarksEmptyDatabasesAndFlushKeepsTheMark(t *testing.T) {
	ctx := context.Background()
	addr := privateRedis(t)
	url := fmt.Sprintf("redis://%s/9", addr)
	require.NoError(t, testredis.Claim(ctx, url))
	for _, db := range []int{9, 10, 11, 12, 13, 14, 15} {
		require.Equal(t, int64(1), client(t, addr, db).Exists(ctx, testredis.Marker).Val(), "database %d", db)
	}
	require.Equal(t, int64(0), client(t, addr, 8).Exists(ctx, testredis.Marker).Val(), "database 8 is not the tests'")

	c := client(t, addr, 11)
	require.NoError(t, c.Set(ctx, "asynq:{default}:t:a-test", "x", 0).Err())
	require.NoError(t, testredis.Flush(ctx, c))
	require.Equal(t, []string{testredis.Marker}, c.Keys(ctx, "*").Val())
	require.NoError(t, c.Set(ctx, "asynq:{default}:t:a-test", "x", 0).Err())
	require.NoError(t, testredis.Claim(ctx, url), "a database the tests wrote in is still theirs")

	require.Error(t, testredis.Flush(ctx, client(t, addr, 9)), "database 9 is shared, never flushed")
	require.Error(t, testredis.Flush(ctx, client(t, addr, 0)))
}
