package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Client is one connection to a coordinator with typed stubs for both
// services. The stubs carry the bearer tokens and the retry policy given to
// Dial; they are safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	addr string // as given to Dial, for logs
	// Runs is RunService (operators and launchers): it sends the token of
	// WithToken.
	Runs v1.RunServiceClient
	// Workers is WorkerService (trainer ranks, environment workers): it
	// sends the run token of WithRunToken.
	Workers v1.WorkerServiceClient
	retry   RetryPolicy
}

// TLS names the files of a TLS or mutual-TLS connection.
type TLS struct {
	// CAFile is a PEM bundle of the CAs that may sign the server's
	// certificate. Empty: the system roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key, for
	// mutual TLS (the server's --client-ca). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name checked in the server's certificate, when it
	// is not the host part of the address (e.g. dialing an IP).
	ServerName string
}

// Option configures Dial.
type Option func(*dialConfig)

type dialConfig struct {
	adminToken, runToken string
	tls                  TLS
	insecure             bool
	retry                RetryPolicy
	extra                []grpc.DialOption
}

// WithToken sets the admin token sent with RunService calls. Servers with
// no admin token configured accept RunService calls without one.
func WithToken(token string) Option { return func(c *dialConfig) { c.adminToken = token } }

// WithRunToken sets the run token (from CreateRun) sent with WorkerService
// calls.
func WithRunToken(token string) Option { return func(c *dialConfig) { c.runToken = token } }

// WithTLS sets the CA, client certificate and server name. Without WithTLS
// the connection uses TLS with the system roots.
func WithTLS(t TLS) Option { return func(c *dialConfig) { c.tls = t } }

// WithInsecure dials in plaintext. Only for a coordinator on loopback or a
// trusted network: tokens then travel in the clear.
func WithInsecure() Option { return func(c *dialConfig) { c.insecure = true } }

// WithRetry replaces DefaultRetryPolicy. Zero Base, Max or AttemptTimeout
// take the default's; MaxAttempts 0 or 1 disables retries (the worker
// helper still resumes its streams and polls, and Worker.ReportSnapshot
// still retries until its context ends, with Base and Max as their
// backoff).
func WithRetry(p RetryPolicy) Option {
	return func(c *dialConfig) {
		if p.Base <= 0 {
			p.Base = DefaultRetryPolicy.Base
		}
		if p.Max <= 0 {
			p.Max = DefaultRetryPolicy.Max
		}
		if p.AttemptTimeout == 0 {
			p.AttemptTimeout = DefaultRetryPolicy.AttemptTimeout
		}
		p.MaxAttempts = max(p.MaxAttempts, 1)
		c.retry = p
	}
}

// WithDialOptions adds grpc dial options (a stats handler for OpenTelemetry,
// a custom dialer), applied after the client's own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *dialConfig) { c.extra = append(c.extra, opts...) }
}

// connectParams reconnect within 0.6 s (0.5 s ±20%) of a coordinator
// restart, so that a worker hears a command issued then (a deadline
// firing) in time, and a call waiting through the outage, or a trainer's
// next step, is answered within a second of the coordinator serving again;
// gRPC's default waits up to two minutes. Measured after kill -9 and a
// restart 3 s later (integration TestFailSafeAnsweredWithinASecondOfServing,
// -race, 2 busy cores): with a 1 s cap, calls were answered 0.23-0.93 s
// after SERVING, and in one run of seven over a second; with 0.5 s,
// 0.00-0.61 s, median 0.33 s.
// The jitter spreads a whole job's workers out. Against a coordinator that
// is down, each connection tries about twice a second: even with a
// connection per worker, 10,000 workers cost 20,000 refused TCP connects a
// second, which is cheap for both hosts. MaxDelay stays at most
// followMaxWait: with a longer one, a command stream re-opened every
// second would still fail until the connection's own wait ended.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
	MinConnectTimeout: 5 * time.Second,
}

// reconnectMaxDelay caps the wait between a connection's attempts to reach
// a coordinator that is down (connectParams).
const reconnectMaxDelay = 500 * time.Millisecond

// keepaliveParams notice a coordinator that stopped answering (frozen, or
// its host gone) under an idle stream or a call in flight: a ping after
// 15 s without a frame from it, and the connection dropped 5 s later
// (the default --election-ttl) without its answer; 40 s before. 15 s, not
// less: the coordinator disconnects a client that pings more often than
// its --keepalive-min-time (10 s by default) allows, and grpc-go never pings
// more often than every 10 s anyway. Over several addresses the calls and
// streams on a frozen leader are cut sooner, when another one serves
// (leaderPolicy); keepalive is what frees the connection itself.
var keepaliveParams = keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

// Dial connects to the coordinator at addr ("host:port"), or to the one
// that leads among several: addr may list them, comma-separated
// ("a:7070,b:7070,c:7070"; see leaderTarget). The connection is made
// lazily: Dial fails only on bad options, not on an unreachable server.
func Dial(addr string, opts ...Option) (*Client, error) {
	cfg := dialConfig{retry: DefaultRetryPolicy}
	for _, o := range opts {
		o(&cfg)
	}
	for _, tok := range []string{cfg.adminToken, cfg.runToken} {
		if err := checkToken(tok); err != nil {
			return nil, err
		}
	}
	creds, err := transportCredentials(cfg)
	if err != nil {
		return nil, err
	}
	target, targetOpts, watch, err := dialTarget(addr)
	if err != nil {
		return nil, err
	}
	auth := bearer{admin: cfg.adminToken, run: cfg.runToken}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(auth.unary, cfg.retry.unaryInterceptor(watch)),
		grpc.WithChainStreamInterceptor(auth.stream, watch.streamInterceptor),
		grpc.WithConnectParams(connectParams),
		grpc.WithKeepaliveParams(keepaliveParams),
	}
	dialOpts = append(dialOpts, targetOpts...)
	conn, err := grpc.NewClient(target, append(dialOpts, cfg.extra...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	return &Client{
		conn: conn, addr: addr, retry: cfg.retry,
		Runs:    v1.NewRunServiceClient(conn),
		Workers: v1.NewWorkerServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, e.g. for a health client.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// checkToken rejects what cannot travel as a metadata value; a token read
// from a file with a stray newline would otherwise fail every call obscurely.
func checkToken(tok string) error {
	for _, r := range tok {
		if r <= ' ' || r > '~' {
			return errors.New("client: a token must be printable ASCII without spaces")
		}
	}
	return nil
}

// ReadTokenFile returns the one token in path. The file may be written like
// the coordinator's --admin-token-file: surrounding whitespace, blank lines
// and lines starting with # are skipped. Unlike that file it must hold
// exactly one token, since a client sends one. Errors never quote a token.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("client: read token file: %w", err)
	}
	var tokens []string
	for line := range strings.Lines(string(b)) {
		if tok := strings.TrimSpace(line); tok != "" && !strings.HasPrefix(tok, "#") {
			tokens = append(tokens, tok)
		}
	}
	switch {
	case len(tokens) == 0:
		return "", fmt.Errorf("client: token file %s holds no token", path)
	case len(tokens) > 1:
		return "", fmt.Errorf("client: token file %s holds %d tokens: a client token file holds one (copy one of the coordinator's admin tokens into a file of its own)", path, len(tokens))
	}
	if err := checkToken(tokens[0]); err != nil {
		return "", fmt.Errorf("%w (token file %s)", err, path)
	}
	return tokens[0], nil
}

func transportCredentials(cfg dialConfig) (credentials.TransportCredentials, error) {
	if cfg.insecure {
		if cfg.tls != (TLS{}) {
			return nil, errors.New("client: TLS options and insecure plaintext are exclusive")
		}
		return insecure.NewCredentials(), nil
	}
	tc, err := tlsConfig(cfg.tls)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(tc), nil
}

func tlsConfig(t TLS) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("client: read CA file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client: CA file %s holds no PEM certificate", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("client: a client certificate needs both the certificate and the key file")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client: load client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
