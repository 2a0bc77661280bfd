package tasks

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
)

// ParseRedisURL reads REDIS_URL into asynq's connection options, which
// every Redis client of valruns is made from (asynq's client, server,
// inspector and scheduler, and through MakeRedisClient the go-redis
// clients of the sweeper, the fair gate and the rate limit):
//
//   - redis://[:PASSWORD@]HOST:PORT/DB and rediss:// (TLS): one server, as
//     asynq.ParseRedisURI reads them;
//   - redis-sentinel://[:PASSWORD@]HOST1:PORT1,HOST2:PORT2,.../DB?master=NAME
//     [&sentinel_password=SP]: the addresses are the sentinels', and the
//     clients (go-redis's failover client) talk to the master they name,
//     following it when Sentinel promotes a replica. PASSWORD is the Redis
//     servers', as in a redis:// URL, and DB is honoured. (asynq's own
//     reading of this scheme ignores DB and takes PASSWORD for the
//     sentinels'.)
func ParseRedisURL(raw string) (asynq.RedisConnOpt, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "redis-sentinel" {
		return asynq.ParseRedisURI(raw)
	}
	opt := asynq.RedisFailoverClientOpt{}
	for _, a := range strings.Split(u.Host, ",") {
		if a = strings.TrimSpace(a); a != "" {
			opt.SentinelAddrs = append(opt.SentinelAddrs, a)
		}
	}
	if len(opt.SentinelAddrs) == 0 {
		return nil, fmt.Errorf("a Sentinel URL lists the sentinels' addresses (redis-sentinel://host1:port1,host2:port2/0?master=NAME)")
	}
	q := u.Query()
	if opt.MasterName = q.Get("master"); opt.MasterName == "" {
		return nil, fmt.Errorf("a Sentinel URL names its master: ?master=NAME")
	}
	opt.SentinelPassword = q.Get("sentinel_password")
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		if opt.DB, err = strconv.Atoi(p); err != nil || opt.DB < 0 {
			return nil, fmt.Errorf("the path of a Sentinel URL is the database number, not %q", p)
		}
	}
	return opt, nil
}
