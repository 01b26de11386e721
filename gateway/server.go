package gateway

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rmsgrad/rmsgrad/jobs"
	"github.com/rmsgrad/rmsgrad/storage"
)

// OpenAPI is the API's OpenAPI 3 document (openapi.yaml), served at
// GET /openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Config wires a Server. Client is required; zero limits take the defaults
// noted.
type Config struct {
	// Client enqueues jobs and reads their state: its queue, retry count,
	// retention, timeout and signing key apply to every job posted here.
	Client *jobs.Client
	// Store, when set, checks every job's URIs against the allow-list
	// before it is enqueued (the worker checks them again) and the URIs
	// of uploads and downloads.
	Store *storage.Router
	// Presigner signs S3 upload and download URLs; nil: no s3:// uploads.
	Presigner Presigner
	// Files serves file:// objects through URLs this gateway signs (the
	// zero-setup mode); nil: no file:// uploads.
	Files *FileObjects
	// UploadPrefix is where uploads the caller does not name go:
	// s3://bucket/prefix/ or file:///dir/. "" leaves naming to callers.
	UploadPrefix string
	// PublicURL is this gateway's base URL as callers reach it, for the
	// file URLs it signs; "" takes the scheme and Host of each request.
	PublicURL string
	// URLExpiry is how long an upload or download URL stays valid;
	// default 5 minutes.
	URLExpiry time.Duration

	// Tokens are the accepted bearer tokens; nil turns authentication off.
	Tokens *Tokens
	// RatePerS and Burst are each token's request rate limit; RatePerS 0
	// turns it off.
	RatePerS float64
	Burst    int
	// MaxBodyBytes bounds a JSON request body; default 1 MiB. A single
	// job's body is also bounded by jobs.MaxPayloadBytes.
	MaxBodyBytes int64
	// MaxBatch bounds the jobs of a batch submit and the ids of a batch
	// wait and the objects of an uploads or downloads request; default 1000.
	MaxBatch int
	// MaxWait bounds a wait's timeout; default 60 s. DefaultWait is the
	// timeout of a wait that names none; default 30 s.
	MaxWait, DefaultWait time.Duration

	// Ready are the dependencies /readyz checks (Redis, the stores).
	Ready []Check
	// Registry receives the gateway's metrics, served at /metrics.
	Registry *prometheus.Registry
	Logger   *slog.Logger
}

// Check is one dependency /readyz asks.
type Check struct {
	Name  string
	Check func(ctx context.Context) error
}

// Server is the HTTP job API. It is an http.Handler.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	limits  *limiters
	metrics *metrics
	log     *slog.Logger

	drainOnce sync.Once
	drain     chan struct{} // closed by Drain
}

// Drain makes every wait in flight, and every wait to come, answer at once
// with the states it has read: call it when shutting down, so that
// http.Server.Shutdown need not sit out long polls.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.drain) }) }

// New checks cfg and returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("gateway: Config.Client is required")
	}
	if cfg.URLExpiry <= 0 {
		cfg.URLExpiry = 5 * time.Minute
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 60 * time.Second
	}
	if cfg.DefaultWait <= 0 || cfg.DefaultWait > cfg.MaxWait {
		cfg.DefaultWait = min(30*time.Second, cfg.MaxWait)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if p := cfg.UploadPrefix; p != "" {
		if !strings.HasSuffix(p, "/") {
			return nil, fmt.Errorf("gateway: upload prefix %q: end it with /", p)
		}
		if err := checkWritable(cfg, p+"probe/in.safetensors"); err != nil {
			return nil, fmt.Errorf("gateway: upload prefix %q: %w", p, err)
		}
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), limits: newLimiters(cfg.RatePerS, cfg.Burst),
		metrics: newMetrics(cfg.Registry), log: cfg.Logger, drain: make(chan struct{})}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	api := func(pattern string, h func(w http.ResponseWriter, r *http.Request) *apiError) {
		s.mux.Handle(pattern, s.observe(pattern, s.authed(h)))
	}
	api("POST /v1/jobs", s.submit)
	api("POST /v1/jobs/batch", s.submitBatch)
	api("POST /v1/jobs/wait", s.waitBatch)
	api("GET /v1/jobs/{id}", s.status)
	api("GET /v1/jobs/{id}/wait", s.wait)
	api("POST /v1/uploads", s.uploads)
	api("POST /v1/downloads", s.downloads)
	// File-store objects: the signature in the URL is the authority.
	plain := func(pattern string, h func(w http.ResponseWriter, r *http.Request) *apiError) {
		s.mux.Handle(pattern, s.observe(pattern, errHandler(h)))
	}
	plain("PUT /v1/files/{path...}", s.putFile)
	plain("GET /v1/files/{path...}", s.getFile)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(OpenAPI)
	})
}

// ServeHTTP routes r. Requests no route takes get JSON 404 and 405
// answers like every other error.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	// The mux's own answer says 404 or 405 (with Allow): keep its status
	// and headers, answer in JSON.
	c := &statusOnly{h: http.Header{}}
	h.ServeHTTP(c, r)
	if allow := c.h.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	if c.status == http.StatusMethodNotAllowed {
		writeError(w, newErr(c.status, CodeMethod, "%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, c.h.Get("Allow")))
		return
	}
	writeError(w, newErr(http.StatusNotFound, CodeNotFound, "no route %s %s (see /openapi.yaml)", r.Method, r.URL.Path))
}

// statusOnly records a handler's status and headers, dropping its body.
type statusOnly struct {
	h      http.Header
	status int
}

func (c *statusOnly) Header() http.Header { return c.h }
func (c *statusOnly) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
}
func (c *statusOnly) Write(p []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return len(p), nil
}

// ctxKey carries the caller's token name in a request's context.
type ctxKey struct{}

// caller returns the name of the token the request came with ("" without
// authentication).
func caller(r *http.Request) string {
	name, _ := r.Context().Value(ctxKey{}).(string)
	return name
}

// errHandler runs h and writes the error it returns.
func errHandler(h func(w http.ResponseWriter, r *http.Request) *apiError) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := h(w, r); e != nil {
			writeError(w, e)
		}
	})
}

// authed checks the bearer token (when tokens are configured) and the
// token's rate limit, then runs h.
func (s *Server) authed(h func(w http.ResponseWriter, r *http.Request) *apiError) http.Handler {
	return errHandler(func(w http.ResponseWriter, r *http.Request) *apiError {
		name := "anonymous"
		if s.cfg.Tokens != nil {
			tok, ok := bearer(r.Header.Get("Authorization"))
			if !ok {
				s.metrics.authFailures.Inc()
				return newErr(http.StatusUnauthorized, CodeUnauthorized, "missing bearer token: send the header Authorization: Bearer <token>")
			}
			if name, ok = s.cfg.Tokens.Lookup(tok); !ok {
				s.metrics.authFailures.Inc()
				return newErr(http.StatusUnauthorized, CodeUnauthorized, "bearer token not recognised: no token file of this gateway holds its hash (mistyped, revoked, or made for another gateway)")
			}
		}
		if ok, d := s.limits.allow(name); !ok {
			s.metrics.rateLimited.Inc()
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter(d)))
			return newErr(http.StatusTooManyRequests, CodeRateLimited, "token %q is over its rate limit of %g requests/s (burst %d): retry after %v",
				name, s.cfg.RatePerS, s.limits.burst, d.Round(time.Millisecond))
		}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, name))
		return h(w, r)
	})
}

// readyz answers 200 "ready" when every dependency answers within 2 s, else
// 503 naming each one down and why, as the worker's /readyz does.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var msgs []string
	for _, c := range s.cfg.Ready {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		err := c.Check(ctx)
		cancel()
		up := 1.0
		if err != nil {
			up = 0
			msgs = append(msgs, c.Name+": "+err.Error())
		}
		s.metrics.depUp.WithLabelValues(c.Name).Set(up)
	}
	if len(msgs) > 0 {
		http.Error(w, "not ready: "+strings.Join(msgs, "; "), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}
