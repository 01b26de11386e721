package main

import "github.com/hibiken/asynq"

// redisOpt turns the redis section (and its secret) into asynq's option,
// as the worker does.
func redisOpt(cfg Config) (asynq.RedisConnOpt, error) {
	return cfg.Redis.Opt(cfg.secrets.RedisPassword)
}
