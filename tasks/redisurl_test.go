package tasks_test

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/tasks"
)

// REDIS_URL's forms: one server as asynq reads it, and the Sentinel form,
// whose password is the Redis servers' and whose path is the database.
func TestParseRedisURL(t *testing.T) {
	t.Parallel()
	good := []struct {
		url  string
		want asynq.RedisConnOpt
	}{
		{"redis://127.0.0.1:6379/3", asynq.RedisClientOpt{Addr: "127.0.0.1:6379", DB: 3}},
		{"redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/2?master=mymaster",
			asynq.RedisFailoverClientOpt{MasterName: "mymaster", SentinelAddrs: []string{"127.0.0.1:26379", "127.0.0.1:26380"}, DB: 2}},
		{"redis-sentinel://:secret@s1:26379?master=m&sentinel_password=spw",
			asynq.RedisFailoverClientOpt{MasterName: "m", SentinelAddrs: []string{"s1:26379"}, Password: "secret", SentinelPassword: "spw"}},
		{"redis-sentinel://app:secret@s1:26379/0?master=m",
			asynq.RedisFailoverClientOpt{MasterName: "m", SentinelAddrs: []string{"s1:26379"}, Username: "app", Password: "secret"}},
	}
	for _, g := range good {
		got, err := tasks.ParseRedisURL(g.url)
		require.NoError(t, err, g.url)
		require.Equal(t, g.want, got, g.url)
	}
	for _, bad := range []string{
		"redis-sentinel://s1:26379/0",          // no master
		"redis-sentinel:///0?master=m",         // no sentinel
		"redis-sentinel://s1:26379/x?master=m", // not a database number
		"http://127.0.0.1:6379",                // not Redis
	} {
		_, err := tasks.ParseRedisURL(bad)
		require.Error(t, err, bad)
	}
}
