package redisconf

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// Each form of the section gives asynq's option of that kind, with the
// password from the caller, never from the section.
func TestOpt(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want func(asynq.RedisConnOpt) bool
	}{
		{"addr", Config{Addr: "h:1", DB: 2, Username: "u"}, func(o asynq.RedisConnOpt) bool {
			r, ok := o.(asynq.RedisClientOpt)
			return ok && r.Addr == "h:1" && r.DB == 2 && r.Username == "u" && r.Password == "pw" && r.TLSConfig == nil
		}},
		{"url with a user", Config{URL: "rediss://acl@h:2/3"}, func(o asynq.RedisConnOpt) bool {
			r, ok := o.(asynq.RedisClientOpt)
			return ok && r.Addr == "h:2" && r.DB == 3 && r.Username == "acl" && r.Password == "pw" && r.TLSConfig != nil
		}},
		{"sentinel", Config{SentinelMaster: "m", SentinelAddrs: []string{"s:1"}, TLS: true}, func(o asynq.RedisConnOpt) bool {
			r, ok := o.(asynq.RedisFailoverClientOpt)
			return ok && r.MasterName == "m" && r.Password == "pw" && r.TLSConfig != nil
		}},
		{"cluster", Config{ClusterAddrs: []string{"c:1", "c:2"}}, func(o asynq.RedisConnOpt) bool {
			r, ok := o.(jobs.ClusterOpt)
			return ok && len(r.Addrs) == 2 && r.Password == "pw"
		}},
	} {
		o, err := c.cfg.Opt("pw")
		if err != nil || !c.want(o) {
			t.Errorf("%s: %#v, %v", c.name, o, err)
		}
	}
	if _, err := (Config{CAFile: "/nonexistent/ca.pem"}).Opt(""); err == nil || !strings.Contains(err.Error(), "redis.ca_file") {
		t.Errorf("a missing CA file: %v, want an error naming redis.ca_file", err)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		key string // "" = valid
	}{
		{Config{Addr: "h:1"}, ""},
		{Config{ClusterAddrs: []string{"a:1"}}, ""},
		{Config{SentinelMaster: "m"}, "redis.sentinel_master"},
		{Config{ClusterAddrs: []string{"a:1"}, URL: "redis://h:1"}, "redis.cluster_addrs"},
		{Config{ClusterAddrs: []string{"a:1"}, SentinelMaster: "m", SentinelAddrs: []string{"s:1"}}, "redis.cluster_addrs"},
		{Config{ClusterAddrs: []string{"a:1"}, DB: 1}, "redis.db"},
		{Config{ClusterAddrs: []string{"redis://a:1"}}, "redis.cluster_addrs"},
	} {
		err := c.cfg.Validate()
		if c.key == "" && err != nil || c.key != "" && (err == nil || !strings.Contains(err.Error(), c.key)) {
			t.Errorf("%+v: %v, want an error naming %q", c.cfg, err, c.key)
		}
	}
	if got := SplitAddrs(" a:1, ,b:2 "); len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Errorf("SplitAddrs: %q", got)
	}
}
