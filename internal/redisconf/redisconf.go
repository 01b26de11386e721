// Package redisconf is the redis section shared by the worker's and the
// gateway's configuration: one Redis (host:port or a redis:// URL),
// Sentinel failover or a Redis Cluster, with an ACL user, a password and
// TLS, turned into asynq's connection option. The password itself is never
// part of the section: the programs read it from RMSGRAD_REDIS_PASSWORD or
// the file password_file names.
package redisconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/rmsgrad/rmsgrad/jobs"
)

// Config says how to reach Redis.
type Config struct {
	Addr           string   `yaml:"addr"`
	URL            string   `yaml:"url"` // redis:// or rediss:// (TLS); overrides addr, db, username
	DB             int      `yaml:"db"`
	Username       string   `yaml:"username"`
	PasswordFile   string   `yaml:"password_file"`
	TLS            bool     `yaml:"tls"`
	CAFile         string   `yaml:"ca_file"`
	SentinelMaster string   `yaml:"sentinel_master"` // set to use Sentinel failover
	SentinelAddrs  []string `yaml:"sentinel_addrs"`
	ClusterAddrs   []string `yaml:"cluster_addrs"` // seed nodes of a Redis Cluster; replaces addr, url and sentinel
}

// Validate checks the keys that go together (sentinel_master and
// sentinel_addrs) and those that do not go with a Redis Cluster. Errors
// name the key.
func (c Config) Validate() error {
	if (c.SentinelMaster == "") != (len(c.SentinelAddrs) == 0) {
		return errors.New("config: redis.sentinel_master: sentinel_master and sentinel_addrs go together")
	}
	if len(c.ClusterAddrs) == 0 {
		return nil
	}
	switch {
	case c.URL != "":
		return errors.New("config: redis.cluster_addrs: set it or redis.url, not both")
	case c.SentinelMaster != "":
		return errors.New("config: redis.cluster_addrs: a Redis Cluster has no Sentinel; set cluster_addrs or sentinel_master, not both")
	case c.DB != 0:
		return fmt.Errorf("config: redis.db: a Redis Cluster has only database 0, got %d", c.DB)
	}
	for _, a := range c.ClusterAddrs {
		if !strings.Contains(a, ":") || strings.Contains(a, "://") {
			return fmt.Errorf("config: redis.cluster_addrs: %q is not host:port", a)
		}
	}
	return nil
}

// Opt returns asynq's connection option for c with password (the secret,
// "" for none): a jobs.ClusterOpt for a Redis Cluster, a failover option
// for Sentinel, else a client option for one Redis.
func (c Config) Opt(password string) (asynq.RedisConnOpt, error) {
	var tlsCfg *tls.Config
	if c.TLS || c.CAFile != "" {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("config: redis.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errors.New("config: redis.ca_file: no PEM certificates in it")
			}
			tlsCfg.RootCAs = pool
		}
	}
	if len(c.ClusterAddrs) > 0 {
		return jobs.ClusterOpt{RedisClusterClientOpt: asynq.RedisClusterClientOpt{Addrs: c.ClusterAddrs,
			Username: c.Username, Password: password, TLSConfig: tlsCfg}}, nil
	}
	if c.SentinelMaster != "" {
		return asynq.RedisFailoverClientOpt{MasterName: c.SentinelMaster, SentinelAddrs: c.SentinelAddrs,
			Username: c.Username, Password: password, DB: c.DB, TLSConfig: tlsCfg}, nil
	}
	if c.URL != "" {
		opt, err := asynq.ParseRedisURI(c.URL)
		if err != nil {
			return nil, fmt.Errorf("config: redis.url: %w", err)
		}
		o, ok := opt.(asynq.RedisClientOpt)
		if !ok {
			return opt, nil
		}
		// asynq.ParseRedisURI keeps the password but drops the ACL user
		// name: take it from the URL, and let redis.username override it.
		if u, err := url.Parse(c.URL); err == nil && u.User != nil {
			o.Username = u.User.Username()
		}
		if c.Username != "" {
			o.Username = c.Username
		}
		if password != "" && o.Password == "" {
			o.Password = password
		}
		if tlsCfg != nil && o.TLSConfig != nil {
			o.TLSConfig.RootCAs = tlsCfg.RootCAs
		}
		return o, nil
	}
	return asynq.RedisClientOpt{Addr: c.Addr, DB: c.DB, Username: c.Username, Password: password, TLSConfig: tlsCfg}, nil
}

// SplitAddrs splits a comma-separated address list (an environment
// variable's value), dropping blanks.
func SplitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
