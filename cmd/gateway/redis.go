package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/hibiken/asynq"
)

// redisOpt turns the redis section (and its secret) into asynq's option,
// as the worker does.
func redisOpt(cfg Config) (asynq.RedisConnOpt, error) {
	rc := cfg.Redis
	var tlsCfg *tls.Config
	if rc.TLS || rc.CAFile != "" {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if rc.CAFile != "" {
			pem, err := os.ReadFile(rc.CAFile)
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
	pw := cfg.secrets.RedisPassword
	if rc.URL != "" {
		opt, err := asynq.ParseRedisURI(rc.URL)
		if err != nil {
			return nil, fmt.Errorf("config: redis.url: %w", err)
		}
		c, ok := opt.(asynq.RedisClientOpt)
		if !ok {
			return opt, nil
		}
		// asynq.ParseRedisURI drops the ACL user name: take it from the URL.
		if u, err := url.Parse(rc.URL); err == nil && u.User != nil {
			c.Username = u.User.Username()
		}
		if rc.Username != "" {
			c.Username = rc.Username
		}
		if pw != "" && c.Password == "" {
			c.Password = pw
		}
		if tlsCfg != nil && c.TLSConfig != nil {
			c.TLSConfig.RootCAs = tlsCfg.RootCAs
		}
		return c, nil
	}
	return asynq.RedisClientOpt{Addr: rc.Addr, DB: rc.DB, Username: rc.Username, Password: pw, TLSConfig: tlsCfg}, nil
}
